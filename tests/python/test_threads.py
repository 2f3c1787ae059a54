"""The CPU library runs with torch.get_num_threads() threads (torch.set_num_threads() is the one
knob), and its results do not depend on the count."""

import pytest
import torch

import helpers as H
import reference as R
from warp_tdt import _core


def _case(seed):
    return R.random_case(B=3, T=12, U=5, V=40, seed=seed)


@pytest.mark.parametrize("threads", [1, 2])
def test_threads_follow_torch(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case = _case(10)
        tok = case["token_logits"]
        spec = _core.Spec("separate", tok.shape[-1], tuple(case["durations"]),
                          case["blank_token_id"], 0.0, 0.0, 0.0, False)
        labels = case["targets"].clamp(min=0).int()
        _, options, _ = _core._build(spec, tok, case["duration_logits"], labels,
                                     case["logit_lengths"].int(), case["target_lengths"].int(),
                                     False)
        assert options.num_threads == torch.get_num_threads()
        g = H.joint_grad(case)
    finally:
        torch.set_num_threads(before)
    torch.set_num_threads(3 - threads)
    try:
        g_other = H.joint_grad(case)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(g, g_other)  # the same bits for any thread count
