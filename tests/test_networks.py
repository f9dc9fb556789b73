"""The Nature CNN's trunk as a learner computes it (``algo.precision`` tf32 and bf16): the first
convolution on frames cut into blocks is the same function, with the same gradients, as the
8x8 stride-4 one actors compute."""

from __future__ import annotations

import pytest
import torch

from tianji_dask.algos.networks import nature_trunk, trunk_features


@pytest.mark.parametrize("precision", ["tf32", "bf16"])
def test_the_blocked_first_convolution_is_the_trunk_actors_compute(precision):
    torch.manual_seed(0)
    actors = nature_trunk()
    learner = nature_trunk()
    learner.load_state_dict(actors.state_dict())
    learner.to(memory_format=torch.channels_last)  # as set_trunk_precision lays it out
    frames = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    want, got = trunk_features(actors, frames, "fp32"), trunk_features(learner, frames, precision)
    assert got.dtype == torch.float32 and got.shape == want.shape == (8, 512)
    tol = 1e-6 if precision == "tf32" else 1e-2  # float32 on the CPU; bfloat16's 8 bits of mantissa
    assert float((got - want).detach().abs().max()) <= tol * float(want.detach().abs().max())
    want.square().sum().backward()
    got.square().sum().backward()
    for (name, a), (_, b) in zip(actors.named_parameters(), learner.named_parameters(), strict=True):
        assert a.grad is not None and b.grad is not None and b.grad.shape == a.shape, name
        if precision == "tf32":
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5 * float(a.grad.abs().max()), msg=name)
        else:
            cos = torch.nn.functional.cosine_similarity(a.grad.flatten(), b.grad.flatten(), dim=0)
            assert float(cos) > 0.99, (name, float(cos))
