"""The streaming combine: any arrival order gives the local forward's sum; partial results renormalize."""

import numpy as np
import pytest

from apps.forward.combine import ForwardIncomplete, StreamingCombine


def _pairs(rng, tokens=5, k=3, n_routed=8, shared=1):
    experts = np.stack([rng.permutation(n_routed)[:k] for _ in range(tokens)])
    weights = rng.random((tokens, k)).astype(np.float32)
    weights /= weights.sum(axis=1, keepdims=True)
    if shared:
        experts = np.concatenate([experts, np.full((tokens, shared), n_routed)], axis=1)
        weights = np.concatenate([weights, np.ones((tokens, shared), np.float32)], axis=1)
    tok = np.repeat(np.arange(tokens), experts.shape[1])
    return tok, experts.ravel(), weights.ravel()


def _combine(tok, exp, w, d=4, n_routed=8):
    return StreamingCombine(n_tokens=int(tok.max()) + 1, d_model=d, layer=0, tokens=tok, experts=exp, weights=w,
                            n_routed=n_routed)


def _outputs(rng, exp, d=4):
    return {int(e): rng.standard_normal((16, d)).astype(np.float32) for e in np.unique(exp)}  # per expert, per token


def _feed(c, tok, exp, ys, skip=()):
    for e in np.random.default_rng(9).permutation(np.unique(exp)):  # arrival order is arbitrary
        if int(e) in skip:
            continue
        pairs = np.flatnonzero(exp == e)
        c.add(pairs, ys[int(e)][tok[pairs]])


def test_any_arrival_order_gives_the_weighted_sum():
    rng = np.random.default_rng(1)
    tok, exp, w = _pairs(rng)
    ys = _outputs(rng, exp)
    c = _combine(tok, exp, w)
    _feed(c, tok, exp, ys)
    expected = np.zeros((5, 4), np.float32)
    for t, e, wi in zip(tok, exp, w, strict=True):
        expected[t] += wi * ys[int(e)][t]
    result = c.finish(allow_partial=False)
    np.testing.assert_allclose(result.out, expected, rtol=1e-6)
    assert result.missing == [] and not result.lost_share.any()


def test_a_pair_is_never_combined_twice():
    rng = np.random.default_rng(2)
    tok, exp, w = _pairs(rng)
    c = _combine(tok, exp, w)
    pairs = np.flatnonzero(exp == exp[0])
    c.add(pairs, np.zeros((len(pairs), 4), np.float32))
    with pytest.raises(ValueError, match="twice"):
        c.add(pairs, np.zeros((len(pairs), 4), np.float32))
    with pytest.raises(ValueError, match="shape"):
        c.add(np.flatnonzero(exp == 8), np.zeros((1, 4), np.float32))


def test_a_batch_of_one_pair_adds_what_a_batch_of_many_adds_for_it():
    """A decode step's batches hold one pair each and take a shorter path: the same products and sums,
    bit for bit, routed and shared alike, and a pair added twice is still refused."""
    rng = np.random.default_rng(3)
    tok, exp, w = _pairs(rng)
    ys = _outputs(rng, exp)
    whole, single = _combine(tok, exp, w), _combine(tok, exp, w)
    _feed(whole, tok, exp, ys)
    for e in np.random.default_rng(9).permutation(np.unique(exp)):  # the same order, one pair at a time
        for pair in np.flatnonzero(exp == e):
            single.add(np.array([pair]), ys[int(e)][tok[[pair]]])
    assert whole.finish(allow_partial=False).out.tobytes() == single.finish(allow_partial=False).out.tobytes()
    with pytest.raises(ValueError, match="twice"):
        single.add(np.array([0]), np.zeros((1, 4), np.float32))


def test_missing_pairs_fail_closed_by_default_and_are_listed():
    rng = np.random.default_rng(3)
    tok, exp, w = _pairs(rng)
    ys = _outputs(rng, exp)
    c = _combine(tok, exp, w)
    gone = int(exp[0])
    _feed(c, tok, exp, ys, skip={gone})
    with pytest.raises(ForwardIncomplete) as caught:
        c.finish(allow_partial=False)
    listed = caught.value.details["missing"]
    assert listed == [{"layer": 0, "expert": gone, "token_index": int(t)} for t in sorted(tok[exp == gone])]
    assert caught.value.reason == "forward_incomplete" and "allow_partial" in caught.value.message


def test_partial_renormalizes_routed_weights_over_the_experts_that_answered():
    rng = np.random.default_rng(4)
    tok, exp, w = _pairs(rng)
    ys = _outputs(rng, exp)
    c = _combine(tok, exp, w)
    gone = int(exp[0])
    _feed(c, tok, exp, ys, skip={gone})
    result = c.finish(allow_partial=True)
    expected = np.zeros((5, 4), np.float32)
    lost = np.zeros(5)
    for t in range(5):
        mine = tok == t
        routed = mine & (exp < 8)
        answered = routed & (exp != gone)
        scale = w[routed].sum() / w[answered].sum()
        for i in np.flatnonzero(answered):
            expected[t] += scale * w[i] * ys[int(exp[i])][t]
        expected[t] += ys[8][t]  # the shared expert, weight 1.0, never rescaled
        lost[t] = w[mine & (exp == gone)].sum() / w[mine].sum()
    np.testing.assert_allclose(result.out, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(result.lost_share, lost, rtol=1e-6)
    assert {m["expert"] for m in result.missing} == {gone}


def test_min_gate_mass_and_tokens_nothing_answered_for_are_errors():
    rng = np.random.default_rng(5)
    tok, exp, w = _pairs(rng, shared=0)
    ys = _outputs(rng, exp)
    c = _combine(tok, exp, w)
    gone = int(exp[0])
    _feed(c, tok, exp, ys, skip={gone})
    share = w[exp == gone].max()
    with pytest.raises(ForwardIncomplete) as caught:
        c.finish(allow_partial=True, min_gate_mass=1.0 - share / 2)
    assert caught.value.reason == "gate_mass_lost"
    assert c.finish(allow_partial=True, min_gate_mass=1.0 - share - 1e-3).missing

    everything = _combine(tok, exp, w)
    _feed(everything, tok, exp, ys, skip=set(exp[tok == 0].tolist()))  # token 0 loses all its experts
    with pytest.raises(ForwardIncomplete, match="nothing answered"):
        everything.finish(allow_partial=True)


def test_activation_codecs_round_trip_within_their_bounds():
    from core.formats.wire import decode_rows, encode_rows, encoded_row_bytes

    x = np.random.default_rng(6).standard_normal((5, 70)).astype(np.float32)  # 70: rows are padded to 96
    for codec, bound in (("f32", 0.0), ("q8_0", np.sqrt(32) / 254)):
        data = encode_rows(x, codec)
        assert len(data) == 5 * encoded_row_bytes(codec, 70)
        back = decode_rows(data, codec, tokens=5, d_model=70)
        assert np.linalg.norm(back - x) / np.linalg.norm(x) <= bound
    with pytest.raises(ValueError, match="bytes"):
        decode_rows(encode_rows(x, "q8_0")[:-1], "q8_0", tokens=5, d_model=70)
    with pytest.raises(ValueError, match="unknown activation encoding"):
        encode_rows(x, "bf16")
