"""Golden values from public test suites, each with its provenance (docs/math.md, section 6)."""

import pytest
import torch

import warp_tdt


def test_nemo_tdt_fixed_case(device):
    # NeMo's TDT unit test: B1, T3, one label (0), V4 with blank 3, durations [0, 1, 2],
    # sigma 0.05, every logit zero.
    z = torch.zeros(1, 3, 2, 4, dtype=torch.float64, device=device, requires_grad=True)
    h = torch.zeros(1, 3, 2, 3, dtype=torch.float64, device=device, requires_grad=True)
    loss = warp_tdt.tdt_loss(z, h, torch.tensor([[0]]), torch.tensor([3]), torch.tensor([1]),
                             3, [0, 1, 2], sigma=0.05, reduction="none")
    assert loss.shape == (1,)
    assert loss.item() == pytest.approx(4.155739, abs=1e-6)
    loss.sum().backward()
    torch.testing.assert_close(z.grad[0, 0, 0].cpu(), torch.tensor(
        [-0.649628, 0.25, 0.25, 0.149628], dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(h.grad[0, 0, 0].cpu(), torch.tensor(
        [0.267258, -0.167926, -0.099332], dtype=torch.float64), atol=1e-6, rtol=0)


def _parakeet_fixture_inputs():
    # transformers tests/models/parakeet/generate_tdt_loss_fixtures.py: torch.manual_seed(42),
    # B2, T8, U4, vocab 5 (+ blank 5), durations [0..4], one joint tensor split in two.
    torch.manual_seed(42)
    B, T, U, V, D = 2, 8, 4, 5, 5
    combined = torch.randn(B, T, U + 1, V + 1 + D)
    targets = torch.randint(0, V, (B, U))
    return combined, targets, torch.tensor([T, T - 1]), torch.tensor([U, U - 1]), V


def test_transformers_parakeet_fixture(device):
    combined, targets, fl, ll, blank = _parakeet_fixture_inputs()
    # the fixture file records the targets, which proves the generator was reproduced
    assert targets.tolist() == [[4, 2, 2, 1], [0, 4, 2, 4]]
    combined = combined.to(device)
    tok, dur = combined[..., :blank + 1], combined[..., blank + 1:]
    args = (targets, fl, ll, blank, [0, 1, 2, 3, 4])
    none = warp_tdt.tdt_loss(tok, dur, *args, reduction="none")
    assert none.dtype == torch.float32
    torch.testing.assert_close(none.cpu(), torch.tensor([12.923372268676758, 9.054794311523438]),
                               atol=2e-5, rtol=0)
    assert warp_tdt.tdt_loss(tok, dur, *args, reduction="sum").item() == pytest.approx(
        21.978166580200195, abs=3e-5)
    assert warp_tdt.tdt_loss(tok, dur, *args).item() == pytest.approx(3.124553918838501, abs=1e-5)
    assert warp_tdt.tdt_loss(tok, dur, *args, sigma=0.05).item() == pytest.approx(
        3.1921849250793457, abs=1e-5)


def test_warp_transducer_rnnt_small(device):
    # warp-transducer's small test: B1, T2, labels {1, 2}, V5, blank 0.
    acts = torch.tensor([0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.2, 0.8, 0.1,
                         0.1, 0.6, 0.1, 0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1, 0.7, 0.1, 0.2, 0.1, 0.1],
                        device=device).view(1, 2, 3, 5)
    loss = warp_tdt.rnnt_loss(acts, torch.tensor([[1, 2]], dtype=torch.int32),
                              torch.tensor([2], dtype=torch.int32),
                              torch.tensor([2], dtype=torch.int32), blank=0, reduction="sum")
    assert loss.item() == pytest.approx(4.495666, abs=1e-5)
