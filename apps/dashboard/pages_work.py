"""Dashboard pages of the network's work: receipts and disputes, prepare jobs, forwards, repair passes.

Thin edges: each view parses its input (a Django form), checks access, calls one selector or
service. Read-only pages follow TENZRO_DASHBOARD_PUBLIC (access.dashboard_page); a mutation needs
a logged-in staff user (`operator_required`) and a CSRF token (Django's middleware).
Live updates arrive over the dashboard websocket; a POST answers JSON to the page's script
(Accept: application/json) and redirects back otherwise, so the forms work without JavaScript.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.catalog.models import PrepareJob
from apps.catalog.selectors import prepare_job_to_dict
from apps.catalog.services import prepare_job_create
from apps.dashboard.access import dashboard_page
from apps.forward.selectors import forwards_recent
from apps.providers.records import is_provider_id
from apps.providers.selectors import provider_ids_named
from apps.receipts.selectors import dispute_view, receipts_list
from apps.receipts.services import dispute_open
from apps.repair.placement import job_pieces, place
from apps.repair.selectors import repair_passes
from apps.reputation.selectors import reputation_rows
from apps.settlement.selectors import ledger_balances
from core.errors import TenzroError
from core.quantization.presets import PRESETS

RECEIPTS_SHOWN = 100
REPUTATION_SHOWN = 50
LEDGER_SHOWN = 50
JOBS_SHOWN = 30
FORWARDS_SHOWN = 50
REPAIR_PASSES_SHOWN = 50


def operator_required(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Mutations: an anonymous user is sent to log in (nothing runs), a non-staff user is refused."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not request.user.is_staff:
            return HttpResponseForbidden("operators (staff users) only")
        return view(request, *args, **kwargs)

    return wrapped


def _wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


class ReceiptFilter(forms.Form):
    model = forms.CharField(required=False, max_length=200)
    expert = forms.IntegerField(required=False, min_value=0)
    holder = forms.CharField(required=False, max_length=64, help_text="A provider id, or a name")
    page = forms.IntegerField(required=False, min_value=1)
    ledger_page = forms.IntegerField(required=False, min_value=1)
    reputation_page = forms.IntegerField(required=False, min_value=1)


def _pages(request: HttpRequest, page: int, more: bool, key: str = "page") -> dict[str, Any]:
    """The newer/older links of a paged list (its page number in the query's `key`), each keeping
    the page's filters and the other lists' pages (templates: _pages.html)."""
    kept = {k: v for k, v in request.GET.items() if k != key and v}
    return {"number": page, "newer": urlencode({**kept, key: page - 1}) if page > 1 else None,
            "older": urlencode({**kept, key: page + 1}) if more else None}


class ForwardFilter(forms.Form):
    model = forms.CharField(required=False, max_length=200)
    result = forms.ChoiceField(required=False, choices=[("", "all"), ("ok", "ok"), ("failed", "failed")])
    page = forms.IntegerField(required=False, min_value=1)


def _refused(request: HttpRequest, exc: TenzroError) -> HttpResponse:
    """An action the node refused: its reason as JSON to the page's script, else as plain text."""
    if _wants_json(request):
        return JsonResponse({"reason": exc.reason, "message": exc.message}, status=exc.http_status)
    return HttpResponse(exc.message, status=exc.http_status, content_type="text/plain")


@dashboard_page
def receipts(request: HttpRequest) -> HttpResponse:
    query = ReceiptFilter(request.GET)
    wanted = query.cleaned_data if query.is_valid() else {}
    page = wanted.get("page") or 1
    holder = wanted.get("holder") or None
    if holder and not is_provider_id(holder):  # a name: every provider that carries it (names are not unique)
        holder = provider_ids_named(holder)
    rows = receipts_list(model_id=wanted.get("model") or None, provider_id=holder, expert=wanted.get("expert"),
                         limit=RECEIPTS_SHOWN + 1, offset=(page - 1) * RECEIPTS_SHOWN)
    # the holder filter narrows the ledger and the reputation to that provider too; each pages on its own
    ledger_page, reputation_page = wanted.get("ledger_page") or 1, wanted.get("reputation_page") or 1
    ledger = ledger_balances(account=holder, limit=LEDGER_SHOWN + 1, offset=(ledger_page - 1) * LEDGER_SHOWN)
    reputation = reputation_rows(REPUTATION_SHOWN + 1, provider_id=holder,
                                 offset=(reputation_page - 1) * REPUTATION_SHOWN)
    context = {"filter": query, "receipts": rows[:RECEIPTS_SHOWN],
               "pages": _pages(request, page, len(rows) > RECEIPTS_SHOWN),
               "ledger": ledger[:LEDGER_SHOWN],
               "ledger_pages": _pages(request, ledger_page, len(ledger) > LEDGER_SHOWN, "ledger_page"),
               "reputation": reputation[:REPUTATION_SHOWN],
               "reputation_pages": _pages(request, reputation_page, len(reputation) > REPUTATION_SHOWN,
                                          "reputation_page"),
               "can_mutate": request.user.is_staff}
    return render(request, "dashboard/receipts.html", context)


@require_POST
@operator_required
def receipt_dispute(request: HttpRequest, receipt_id: int) -> HttpResponse:
    try:
        dispute = dispute_open(receipt_id=receipt_id)
    except TenzroError as exc:
        return _refused(request, exc)
    if _wants_json(request):
        return JsonResponse(dispute_view(dispute))
    return redirect("dashboard-receipts")


# experts a checkpoint stores as MXFP4 (gpt-oss) stay MXFP4 whatever is chosen (docs/formats.md)
QUANT_CHOICES = [("", "none (f32, or the checkpoint's MXFP4)"),
                 *((name, name) for name in sorted(PRESETS) if name != "none")]


class PrepareForm(forms.Form):
    model_id = forms.CharField(max_length=200)
    layer = forms.IntegerField(min_value=0)
    experts = forms.CharField(max_length=2000, help_text="Ids and ranges: 0,1,4-7")
    quant = forms.ChoiceField(choices=QUANT_CHOICES, required=False)
    checkpoint = forms.CharField(max_length=1000, required=False, help_text="Folder or http(s) URL; empty: "
                                 "the catalog's default source")

    def clean_experts(self) -> list[int]:
        ids: set[int] = set()
        for part in self.cleaned_data["experts"].replace(" ", "").split(","):
            if not part:
                continue
            low, _, high = part.partition("-")
            try:
                first, last = int(low), int(high or low)
            except ValueError as exc:
                raise forms.ValidationError(f"{part!r} is not an id or a range like 4-7") from exc
            if first < 0 or last < first or last - first > 4096:
                raise forms.ValidationError(f"{part!r} is not a valid range")
            ids.update(range(first, last + 1))
        if not ids:
            raise forms.ValidationError("name at least one expert")
        return sorted(ids)


def _prepare_page(request: HttpRequest, form: PrepareForm, *, error: str = "", status: int = 200) -> HttpResponse:
    jobs = [prepare_job_to_dict(job) for job in PrepareJob.objects.all()[:JOBS_SHOWN]]
    return render(request, "dashboard/prepare.html", {"form": form, "jobs": jobs, "error": error,
                                                      "can_mutate": request.user.is_staff}, status=status)


@dashboard_page
def prepare(request: HttpRequest) -> HttpResponse:
    return _prepare_page(request, PrepareForm(initial={"layer": 0, "quant": "q8_0"}))


@require_POST
@operator_required
def prepare_start(request: HttpRequest) -> HttpResponse:
    form = PrepareForm(request.POST)
    if not form.is_valid():
        if _wants_json(request):
            return JsonResponse({"reason": "invalid_input", "errors": form.errors.get_json_data()}, status=400)
        return _prepare_page(request, form, status=400)
    data = form.cleaned_data
    try:
        job = prepare_job_create(model_id=data["model_id"], layer=data["layer"], experts=data["experts"],
                                 quant=data["quant"] or None, checkpoint=data["checkpoint"] or None)
    except TenzroError as exc:
        if _wants_json(request):
            return JsonResponse({"reason": exc.reason, "message": exc.message}, status=exc.http_status)
        return _prepare_page(request, form, error=exc.message, status=exc.http_status)
    if _wants_json(request):
        return JsonResponse(prepare_job_to_dict(job), status=201)
    return redirect("dashboard-prepare")


@require_POST
@operator_required
def prepare_place(request: HttpRequest, job_id: str) -> HttpResponse:
    """Place a finished job's experts over this node and its gossip view's holders, loading this node's
    share and the gates (tenzro_moePlace with its defaults)."""
    try:
        experts, gates = job_pieces([str(job_id)])
        placed = place(experts=experts, gates=gates, providers=None, replication=None, load_gates=True)
    except TenzroError as exc:
        return _refused(request, exc)
    if _wants_json(request):
        return JsonResponse(placed)
    return redirect("dashboard-prepare")


@dashboard_page
def forwards(request: HttpRequest) -> HttpResponse:
    query = ForwardFilter(request.GET)
    wanted = query.cleaned_data if query.is_valid() else {}
    page = wanted.get("page") or 1
    ok = {"ok": True, "failed": False}.get(wanted.get("result") or "")
    rows = forwards_recent(limit=FORWARDS_SHOWN + 1, offset=(page - 1) * FORWARDS_SHOWN,
                           model_id=wanted.get("model") or None, ok=ok)
    return render(request, "dashboard/forwards.html", {"forwards": rows[:FORWARDS_SHOWN], "filter": query,
                                                       "pages": _pages(request, page, len(rows) > FORWARDS_SHOWN)})


@dashboard_page
def repair(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/repair.html", {"passes": repair_passes(limit=REPAIR_PASSES_SHOWN)})
