"""The CLI names providers and says what a forward's hedges did."""

from cli.names import forward_summary, label, with_provider_names

A, B = "a" * 64, "b" * 64
NAMES = {A: "gpu-box"}


def test_names_are_added_beside_every_known_provider_id() -> None:
    plan = {"batches": [{"provider": A, "backups": [B]}, {"provider": B}], "receipts": [{"provider_id": A}]}
    named = with_provider_names(plan, NAMES)
    assert named["batches"][0] == {"provider": A, "backups": [B], "provider_name": "gpu-box"}
    assert named["batches"][1] == {"provider": B}  # no name known: left as it was
    assert named["receipts"][0]["provider_name"] == "gpu-box"


def test_forward_summary_calls_a_raced_out_stall_a_hedge_not_an_error() -> None:
    result = {"tokens": 3, "missing": [], "stats": {
        "forward_id": "f" * 32, "elapsed_ms": 12.25, "hedges_fired": 1, "hedges_won": 1, "codecs": ["q8_0"],
        "holders": [{"provider": A, "rows": 3, "transport": "quic"}],
        "failures": [{"provider": B, "reason": "stalled", "layer": 0, "expert": 5, "rows": 3},
                     {"provider": A, "reason": "deadline_exceeded", "layer": 0, "expert": 2, "rows": 1}]}}
    line = forward_summary(result, NAMES)
    assert line.startswith("forward ffffffffffff: 3 tokens in 12.2 ms; holders: gpu-box (aaaaaa) 3 rows")
    assert "wire codecs: q8_0" in line and "hedges fired 1, won 1" in line
    assert f"{B[:12]}… expert 0/5 stalled, raced out by a hedge" in line
    assert "expert 0/2 failed (deadline_exceeded), retried on another holder" in line


def test_a_default_name_is_not_followed_by_its_own_digits_again() -> None:
    assert label(A, {A: "vm-aaaaaa"}) == "vm-aaaaaa" and label(A, {A: "gpu-box"}) == "gpu-box (aaaaaa)"
    assert label(B, {}) == "bbbbbbbbbbbb…"
