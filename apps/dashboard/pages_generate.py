"""The generate page (/generate/): run a prompt (text, a chat turn, or token ids) against a model whose
dense part this router holds, and watch its text, its tokens and each MoE layer's fan-out arrive live.

Thin edges, as pages_work: reading follows TENZRO_DASHBOARD_PUBLIC (dashboard_page); starting a
generation needs a logged-in staff user (`operator_required`) and a CSRF token. The form's values
go through the API's own schema (GenerateParams) and the same call as tenzro_moeGenerate
(`generation_begin`), so the limits and error messages are the RPC's. Steps arrive over the
dashboard websocket as `generation.progress`; /generate/data.json gives the page the whole record
when it selects a generation or its socket (re)connects, so no step is missed in between. The live
view of the router's continuous batching comes as `generation.batching`, and whole from
/generate/batching.json when the page opens or its socket (re)connects.
"""

from __future__ import annotations

from typing import Any

from asgiref.sync import async_to_sync
from django import forms
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from pydantic import ValidationError

from apps.dashboard.access import dashboard_page
from apps.dashboard.pages_work import _wants_json, operator_required
from apps.generation import selectors
from apps.generation.api import GenerateParams, batching, generation_begin
from apps.providers.selectors import held_models
from apps.serving.selectors import keys_list
from core.errors import TenzroError

GENERATIONS_SHOWN = 30
STEPS_SHOWN = 200  # the newest steps' fan-out on the page; the whole record: tenzro_moeGeneration
WIRE_CHOICES = [("", "default (Q8_0 first)"), ("f32", "f32"), ("q8_0", "q8_0")]


class GenerateForm(forms.Form):
    model_id = forms.CharField(max_length=200, label="Model",
                               widget=forms.TextInput(attrs={"list": "generate-models", "autocomplete": "off"}))
    prompt = forms.CharField(max_length=100_000, required=False, label="Prompt", strip=False,
                             widget=forms.Textarea(attrs={"rows": 3}),
                             help_text="Text, encoded with the model's tokenizer (its checkpoint must have one)")
    as_chat = forms.BooleanField(required=False, label="As a chat turn",
                                 help_text="the prompt is one user message, through the model's chat template")
    prompt_ids = forms.CharField(max_length=65536, required=False, label="Or prompt token ids",
                                 widget=forms.Textarea(attrs={"rows": 2}),
                                 help_text="Comma-separated, e.g. 97, 47, 42 (instead of text)")
    max_new_tokens = forms.IntegerField(min_value=1, initial=16, label="Max new tokens")
    temperature = forms.FloatField(min_value=0.0, max_value=2.0, required=False, label="Temperature",
                                   help_text="empty or 0: greedy")
    allow_partial = forms.BooleanField(required=False, label="Allow partial",
                                       help_text="renormalize away lost experts' gate mass instead of failing")
    wire = forms.ChoiceField(choices=WIRE_CHOICES, required=False, label="Wire")

    def clean_prompt_ids(self) -> list[int] | None:
        if not self.cleaned_data["prompt_ids"].strip():
            return None
        ids = []
        for part in self.cleaned_data["prompt_ids"].replace("\n", ",").replace(" ", ",").split(","):
            if not part:
                continue
            if not part.isdigit():
                raise forms.ValidationError(f"{part!r} is not a token id (a whole number from 0)")
            ids.append(int(part))
        if not ids:
            raise forms.ValidationError("give at least one token id")
        return ids

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if not self.errors and bool(data.get("prompt")) == (data.get("prompt_ids") is not None):
            raise forms.ValidationError("give a prompt as text or as token ids (one of the two)")
        return data

    def params(self) -> GenerateParams:
        """The RPC's params (its schema's checks); ValueError with a readable reason."""
        data = self.cleaned_data
        if data["prompt_ids"] is not None:
            prompt: dict[str, Any] = {"prompt_ids": data["prompt_ids"]}
        elif data["as_chat"]:
            prompt = {"messages": [{"role": "user", "content": data["prompt"]}]}
        else:
            prompt = {"prompt": data["prompt"]}
        temperature = data.get("temperature")
        try:
            return GenerateParams.model_validate({
                "model_id": data["model_id"].strip(), **prompt,
                "max_new_tokens": data["max_new_tokens"], "allow_partial": data["allow_partial"],
                "wire": data["wire"] or None, "wait": False,
                **({"sampling": {"temperature": temperature}} if temperature else {})})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise ValueError(f"{'.'.join(map(str, first['loc']))}: {first['msg']}") from exc


def _selected(generation_id: str) -> tuple[dict[str, Any] | None, str]:
    if not generation_id:
        return None, ""
    try:
        generation = selectors.generation_get(generation_id=generation_id)
    except TenzroError as exc:
        return None, exc.message
    generation["steps_hidden"] = max(0, len(generation["steps"]) - STEPS_SHOWN)
    generation["steps"] = generation["steps"][-STEPS_SHOWN:]
    return generation, ""


def _page(request: HttpRequest, form: GenerateForm, *, generation_id: str = "", error: str = "",
          status: int = 200) -> HttpResponse:
    selected, missing = _selected(generation_id)
    models = list(dict.fromkeys([*selectors.generation_models(), *held_models()]))
    context = {"form": form, "error": error, "can_mutate": request.user.is_staff, "models": models,
               "selected": selected, "missing": missing, "steps_shown": STEPS_SHOWN,
               "generations": selectors.generations_recent(limit=GENERATIONS_SHOWN),
               # who uses the OpenAI-compatible API and how much: operators only (names and prefixes)
               "client_keys": keys_list() if request.user.is_staff else None}
    return render(request, "dashboard/generate.html", context, status=status)


@dashboard_page
def generate(request: HttpRequest) -> HttpResponse:
    return _page(request, GenerateForm(initial={"max_new_tokens": 16, "wire": ""}),
                 generation_id=request.GET.get("id", "")[:32])


@dashboard_page
def generate_data(request: HttpRequest) -> JsonResponse:
    """One generation with its steps (the newest STEPS_SHOWN), as the page's script merges it."""
    generation, missing = _selected(request.GET.get("id", "")[:32])
    if generation is None:
        return JsonResponse({"reason": "unknown_generation", "message": missing or "id is required"}, status=404)
    return JsonResponse(generation)


@dashboard_page
def generate_batching(request: HttpRequest) -> JsonResponse:
    """The router's continuous batching now (tenzro_moeBatching), as the page's live view draws it."""
    try:
        return JsonResponse(async_to_sync(batching)())
    except TenzroError as exc:  # the worker is down: the view says so instead of showing stale figures
        return JsonResponse({"reason": exc.reason, "message": exc.message}, status=exc.http_status)


@require_POST
@operator_required
def generate_start(request: HttpRequest) -> HttpResponse:
    form = GenerateForm(request.POST)
    try:
        if not form.is_valid():
            raise ValueError("; ".join(f"{form.fields[name].label if name in form.fields else 'form'}: "
                                       f"{' '.join(errors)}" for name, errors in form.errors.items()))
        generation_id = async_to_sync(generation_begin)(form.params())
    except ValueError as exc:
        if _wants_json(request):
            return JsonResponse({"reason": "invalid_input", "message": str(exc)}, status=400)
        return _page(request, form, error=str(exc), status=400)
    except TenzroError as exc:  # dense_not_loaded, a token id outside the vocabulary, busy, worker down
        if _wants_json(request):
            return JsonResponse({"reason": exc.reason, "message": exc.message}, status=exc.http_status)
        return _page(request, form, error=exc.message, status=exc.http_status)
    if _wants_json(request):
        return JsonResponse({"generation_id": generation_id}, status=201)
    return redirect(f"{reverse('dashboard-generate')}?id={generation_id}")
