"""The fused Triton cross-entropy against its torch reference.

On CPU the kernel runs in the Triton interpreter (TRITON_INTERPRET=1, set by
conftest). Tolerances: the forward loss is accumulated in fp32 from the same
input values in both implementations, so it agrees to ~1e-6 whatever the
input dtype. Gradients are rounded to the input dtype, so low-precision
gradients may differ by one ulp: rtol 1.6e-2 (bf16, 8 mantissa bits) and
1e-3 (fp16, 11 bits), the torch.testing defaults for those dtypes.
"""

import pytest
import torch

import tinyllm.kernels.cross_entropy as ce
from tinyllm.data.packing import IGNORE_INDEX
from tinyllm.kernels.cross_entropy import cross_entropy, cross_entropy_reference, triton_available

pytestmark = pytest.mark.correctness

LOSS_TOL = dict(atol=1e-5, rtol=1e-5)
GRAD_TOL = {
    torch.float32: dict(atol=1e-6, rtol=1e-5),
    torch.bfloat16: dict(atol=1e-5, rtol=1.6e-2),
    torch.float16: dict(atol=1e-5, rtol=1e-3),
}
# Odd vocabularies, a non-power-of-two row count, one row, and vocabularies
# wider than one BLOCK_V (1024) so the online logsumexp loop runs several times.
SHAPES = [(1, 7), (3, 128), (17, 131), (64, 160), (100, 257), (5, 3001)]
LOW_PRECISION_SHAPES = [(16, 160), (33, 1000), (7, 3001)]


@pytest.fixture
def kdevice(device):
    if not triton_available(torch.empty(0, device=device)):
        pytest.skip("triton cannot run on this device (missing, or CPU without TRITON_INTERPRET=1)")
    return device


def make_inputs(n, v, dtype, device, ignore_every=0):
    logits = (3 * torch.randn(n, v, device=device)).to(dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), device=device)
    if ignore_every:
        targets[::ignore_every] = IGNORE_INDEX
    return logits, targets


def kernel_and_reference(logits, targets, reduction="mean", ignore_index=IGNORE_INDEX):
    """(loss, grad) from the kernel and from the reference, for the same inputs."""
    out = []
    for fn in (lambda *a, **k: cross_entropy(*a, use_triton=True, **k), cross_entropy_reference):
        logits.grad = None
        loss = fn(logits, targets, ignore_index=ignore_index, reduction=reduction)
        (loss.sum() if reduction == "none" else loss).backward()
        out.append((loss.detach(), logits.grad.clone()))
    return out


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_forward_fp32(shape, kdevice):
    logits, targets = make_inputs(*shape, torch.float32, kdevice)
    (loss, _), (ref, _) = kernel_and_reference(logits, targets, reduction="none")
    torch.testing.assert_close(loss, ref, **LOSS_TOL)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backward_fp32(shape, kdevice):
    logits, targets = make_inputs(*shape, torch.float32, kdevice)
    (_, grad), (_, ref_grad) = kernel_and_reference(logits, targets)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", LOW_PRECISION_SHAPES, ids=str)
def test_forward_low_precision(shape, dtype, kdevice):
    logits, targets = make_inputs(*shape, dtype, kdevice)
    (loss, _), (ref, _) = kernel_and_reference(logits, targets, reduction="none")
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, **LOSS_TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", LOW_PRECISION_SHAPES, ids=str)
def test_backward_low_precision(shape, dtype, kdevice):
    logits, targets = make_inputs(*shape, dtype, kdevice)
    (_, grad), (_, ref_grad) = kernel_and_reference(logits, targets)
    assert grad.dtype == dtype
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[dtype])


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_reductions(reduction, kdevice):
    logits, targets = make_inputs(40, 160, torch.float32, kdevice, ignore_every=3)
    (loss, grad), (ref, ref_grad) = kernel_and_reference(logits, targets, reduction=reduction)
    torch.testing.assert_close(loss, ref, **LOSS_TOL)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[torch.float32])


def test_ignored_rows_have_zero_loss_and_zero_gradient(kdevice):
    logits, targets = make_inputs(20, 131, torch.float32, kdevice, ignore_every=4)
    losses = cross_entropy(logits, targets, reduction="none", use_triton=True)
    losses.sum().backward()
    ignored = targets == IGNORE_INDEX
    assert ignored.sum() == 5
    assert (losses[ignored] == 0).all() and (losses[~ignored] > 0).all()
    assert (logits.grad[ignored] == 0).all()
    assert (logits.grad[~ignored] != 0).any(dim=-1).all()


def test_custom_ignore_index(kdevice):
    logits, targets = make_inputs(24, 64, torch.float32, kdevice)
    targets[::2] = 0
    (loss, grad), (ref, ref_grad) = kernel_and_reference(logits, targets, ignore_index=0)
    torch.testing.assert_close(loss, ref, **LOSS_TOL)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[torch.float32])


def test_mean_over_all_ignored_targets_is_nan_like_torch(kdevice):
    logits, targets = make_inputs(4, 16, torch.float32, kdevice)
    targets.fill_(IGNORE_INDEX)
    assert cross_entropy(logits, targets, use_triton=True).isnan()
    assert cross_entropy_reference(logits, targets).isnan()


def test_batched_logits_are_flattened(kdevice):
    logits = torch.randn(3, 11, 97, device=kdevice, requires_grad=True)
    targets = torch.randint(0, 97, (3, 11), device=kdevice)
    assert cross_entropy(logits, targets, reduction="none", use_triton=True).shape == (3, 11)
    (loss, grad), (ref, ref_grad) = kernel_and_reference(logits, targets)
    torch.testing.assert_close(loss, ref, **LOSS_TOL)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[torch.float32])


def test_non_contiguous_logits(kdevice):
    base = torch.randn(160, 30, device=kdevice)
    logits = base.t().requires_grad_()  # [30, 160], row stride 1
    assert not logits.is_contiguous()
    targets = torch.randint(0, 160, (30,), device=kdevice)
    (loss, grad), (ref, ref_grad) = kernel_and_reference(logits, targets)
    torch.testing.assert_close(loss, ref, **LOSS_TOL)
    torch.testing.assert_close(grad, ref_grad, **GRAD_TOL[torch.float32])


def test_upstream_gradient_scales_the_result(kdevice):
    logits, targets = make_inputs(9, 50, torch.float32, kdevice)
    (3.0 * cross_entropy(logits, targets, use_triton=True)).backward()
    scaled = logits.grad.clone()
    logits.grad = None
    cross_entropy(logits, targets, use_triton=True).backward()
    torch.testing.assert_close(scaled, 3.0 * logits.grad, atol=1e-7, rtol=1e-6)


def test_gradient_rows_sum_to_zero(kdevice):
    """softmax sums to one and the one-hot to one: each valid row's gradient sums to zero."""
    logits, targets = make_inputs(12, 131, torch.float32, kdevice)
    cross_entropy(logits, targets, reduction="sum", use_triton=True).backward()
    torch.testing.assert_close(logits.grad.sum(-1), torch.zeros(12, device=kdevice), atol=1e-5, rtol=0)


def test_large_logits_are_numerically_stable(kdevice):
    logits = (1e4 * torch.randn(8, 160, device=kdevice)).requires_grad_()
    targets = torch.randint(0, 160, (8,), device=kdevice)
    (loss, grad), (ref, ref_grad) = kernel_and_reference(logits, targets)
    assert loss.isfinite() and grad.isfinite().all()
    torch.testing.assert_close(loss, ref, atol=1e-2, rtol=1e-5)
    torch.testing.assert_close(grad, ref_grad, atol=1e-6, rtol=1e-5)


def test_dispatch_uses_the_kernel_when_available(kdevice, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("reference called although the kernel is available")

    monkeypatch.setattr(ce, "cross_entropy_reference", forbidden)
    logits, targets = make_inputs(4, 32, torch.float32, kdevice)
    assert cross_entropy(logits, targets).isfinite()


def test_falls_back_to_reference_without_triton(monkeypatch, device):
    monkeypatch.setattr(ce, "triton", None)
    logits = torch.randn(2, 5, 40, device=device)
    targets = torch.randint(0, 40, (2, 5), device=device)
    assert not triton_available(logits)
    expected = torch.nn.functional.cross_entropy(logits.reshape(10, 40), targets.reshape(10))
    torch.testing.assert_close(cross_entropy(logits, targets), expected)


def test_cpu_without_interpreter_falls_back(monkeypatch):
    monkeypatch.setattr(ce, "TRITON_INTERPRET", False)
    assert not triton_available(torch.empty(2, 3))


def test_forcing_triton_without_a_backend_is_an_error(monkeypatch, device):
    monkeypatch.setattr(ce, "triton", None)
    logits, targets = make_inputs(2, 8, torch.float32, device)
    with pytest.raises(RuntimeError, match="triton cannot run on this device"):
        cross_entropy(logits, targets, use_triton=True)


def test_shape_mismatch_is_rejected(device):
    with pytest.raises(ValueError, match="do not match"):
        cross_entropy(torch.randn(4, 8, device=device), torch.zeros(5, dtype=torch.long, device=device))


def test_unknown_reduction_is_rejected(device):
    with pytest.raises(ValueError, match="unknown reduction 'max'"):
        cross_entropy(torch.randn(4, 8, device=device), torch.zeros(4, dtype=torch.long, device=device), reduction="max")
