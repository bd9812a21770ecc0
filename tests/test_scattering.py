"""The scattering transform (dpopt.scattering): its output's shape, determinism, the filter bank's
energy bounds and exact values (Littlewood–Paley), known values at known inputs, and the features
cache (computed once, reused, recomputed for other data or a damaged file)."""

from __future__ import annotations

import pytest
import torch

from dpopt import cache, checkpoint, progress, scattering
from dpopt._validate import DpoptError
from dpopt.scattering import Scattering2D

F64 = torch.float64
MNIST = Scattering2D((28, 28))


def images(count: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    return torch.rand(count, 28, 28, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def test_shape_channels_and_dtype():
    assert MNIST.channels == 81 and MNIST.output_shape == (7, 7)
    assert MNIST(images(3)).shape == (3, 81, 7, 7)
    assert MNIST(images(3, dtype=torch.float32)).dtype == torch.float32
    two_channels = torch.stack([images(2), images(2, seed=1)], dim=1)   # [B, C, H, W]: K channels per input channel
    out = MNIST(two_channels)
    assert out.shape == (2, 162, 7, 7)
    assert torch.equal(out[:, 81:], MNIST(images(2, seed=1)))
    assert Scattering2D((32, 32), J=3, L=4).channels == 1 + 3 * 4 + 16 * 3 and Scattering2D((32, 32), J=3, L=4)(
        torch.rand(1, 32, 32)).shape == (1, 61, 4, 4)


def test_bad_shapes_are_refused():
    with pytest.raises(DpoptError, match=r"shape=\(30, 28\) must be multiples of 2\^J = 4"):
        Scattering2D((30, 28))
    with pytest.raises(DpoptError, match=r"images of shape \(2, 27, 28\) must be"):
        MNIST(torch.rand(2, 27, 28))


def test_deterministic_and_each_image_on_its_own():
    """The same images give the same bits, and an image's features do not depend on the others of
    its chunk (the transform is a per-record map)."""
    batch = images(16, dtype=torch.float32)
    assert torch.equal(MNIST(batch), MNIST(batch.clone()))
    assert torch.equal(MNIST(batch[5:6]), MNIST(batch)[5:6])
    changed = batch.clone()
    changed[0] = 1.0
    assert torch.equal(MNIST(changed)[1:], MNIST(batch)[1:])


def test_filter_bank_littlewood_paley():
    """Wavelets of zero mean, a low-pass of unit mean, and 0.12 ≤ A(ω) ≤ 1 for the Littlewood–Paley
    sum A(ω) = |φ̂(ω)|² + ½ Σ_{j,θ} (|ψ̂_{j,θ}(ω)|² + |ψ̂_{j,θ}(−ω)|²): the first layer keeps between
    12 % and all of a real image's energy (it is non-expansive)."""
    phi, psi = MNIST.filters(F64)
    assert phi[0][0, 0].item() == pytest.approx(1.0, abs=1e-12) and phi[1][0, 0].item() == pytest.approx(1.0, abs=1e-12)
    assert max(float(levels[0][:, 0, 0].abs().max()) for levels in psi) < 1e-12
    total = phi[0] ** 2
    for levels in psi:
        mirrored = torch.roll(torch.flip(levels[0], dims=(-2, -1)), shifts=(1, 1), dims=(-2, -1))   # ψ̂(−ω)
        total = total + 0.5 * (levels[0] ** 2 + mirrored ** 2).sum(0)
    assert 0.12 < float(total.min()) and float(total.max()) <= 1 + 1e-12


def test_energy_of_the_first_layer_is_bounded_by_the_image():
    """Parseval with the bound above on a periodic 36 × 36 image: ‖x ⋆ φ‖² + Σ ‖x ⋆ ψ‖² ≤ ‖x‖²."""
    phi, psi = MNIST.filters(F64)
    x = torch.rand(36, 36, generator=torch.Generator().manual_seed(3), dtype=F64)
    spectrum = torch.fft.fft2(x)
    energy = (torch.fft.ifft2(spectrum * phi[0]).abs() ** 2).sum()
    for levels in psi:
        energy = energy + (torch.fft.ifft2(spectrum * levels[0]).abs() ** 2).sum()
    assert 0.12 * (x ** 2).sum() < energy <= (x ** 2).sum()


def test_values_at_known_inputs():
    """A constant image c: S0 = c (unit low-pass), S1 = S2 = 0 (zero-mean wavelets); homogeneity
    S(a·x) = a·S(x); and an image of two impulses, whose coefficients kymatio 0.3.0 (float64) computed
    (its Gabor normalisation uses 3.1415 for π: its values divided by (π/3.1415)^(order + 1))."""
    out = MNIST(torch.full((1, 28, 28), 0.7, dtype=F64))[0]
    assert torch.allclose(out[0], torch.full((7, 7), 0.7, dtype=F64), rtol=1e-12, atol=0)
    assert float(out[1:].abs().max()) < 1e-12
    x = images(2)
    assert torch.allclose(MNIST(2.5 * x), 2.5 * MNIST(x), rtol=1e-12, atol=1e-15)
    impulses = torch.zeros(1, 28, 28, dtype=F64)
    impulses[0, 14, 14], impulses[0, 5, 20] = 1.0, 0.5
    out = MNIST(impulses)[0]
    kymatio = {(0, 3, 3): 0.013031517737166246, (1, 3, 3): 0.01198585110146236, (5, 1, 4): 0.0035411522228430228,
               (9, 3, 3): 0.009617008283148043, (13, 2, 3): 0.001237616398708427, (17, 3, 3): 0.005869779934753497,
               (50, 1, 4): 0.0012961711326750663, (80, 3, 3): 0.006433382918195506}
    for (channel, row, column), value in kymatio.items():
        assert out[channel, row, column].item() == pytest.approx(value, rel=1e-6)


# ------------------------------------------------------------------------------ the cache


class Counting:
    """The transform, counting the images it is called on."""

    def __init__(self) -> None:
        self.images = 0

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        self.images += len(batch)
        return MNIST(batch)


def test_features_are_computed_once_and_reused(tmp_path, monkeypatch):
    monkeypatch.setenv("DPOPT_CACHE", str(tmp_path))
    data = images(10, dtype=torch.float32).numpy()
    counting = Counting()
    first = scattering.features(counting, data, name=repr(MNIST), chunk=4)
    assert counting.images == 10 and first.shape == (10, 81 * 49)
    assert torch.equal(first, MNIST(torch.from_numpy(data)).reshape(10, -1))
    assert len(list((cache.folder() / "features").glob("*.pt"))) == 1
    again = scattering.features(counting, data, name=repr(MNIST))
    assert counting.images == 10 and torch.equal(again, first)


def test_features_are_recomputed_for_other_data_another_transform_or_a_damaged_file(tmp_path):
    data = images(6, dtype=torch.float32).numpy()
    counting = Counting()
    first = scattering.features(counting, data, name="a", folder=tmp_path)
    path, = tmp_path.glob("*.pt")
    changed = data.copy()
    changed[3, 0, 0] += 0.25   # one pixel of one record: another digest
    scattering.features(counting, changed, name="a", folder=tmp_path)
    assert counting.images == 12
    scattering.features(counting, data, name="b", folder=tmp_path)   # another transform's parameters
    assert counting.images == 18 and len(list(tmp_path.glob("*.pt"))) == 3
    path.write_bytes(path.read_bytes()[:-10])   # truncated
    assert torch.equal(scattering.features(counting, data, name="a", folder=tmp_path), first)
    assert counting.images == 24
    assert torch.equal(checkpoint.load(path), first)   # rewritten whole


def test_group_normalised_features_are_per_image_and_feed_the_linear_model():
    """GroupNorm folded into the features: each image's groups have mean 0 and variance 1 whatever
    the other images, and ``"linear"`` on them is ``"scatternet-linear"`` (GroupNorm inside) on the
    raw transform, with the same weights for the same seed."""
    from dpopt.models import make_model

    normalised = scattering.GroupNormalised(MNIST, 27)
    batch = images(6)
    batch[1:] *= 100.0
    out = normalised(batch)
    assert out.shape == (6, 81, 7, 7)
    groups = out.reshape(6, 27, -1)
    assert groups.mean(-1).abs().max() < 1e-12
    raw = MNIST(batch).reshape(6, 27, -1).var(-1, unbiased=False)
    assert torch.allclose(groups.var(-1, unbiased=False), raw / (raw + 1e-5), rtol=1e-10, atol=0)
    assert torch.allclose(normalised(batch[:1]), out[:1], rtol=1e-12, atol=1e-12)
    linear = make_model("linear", inputs=3969, seed=0).double()
    reference = make_model("scatternet-linear", groups=27, seed=0).double()
    with torch.no_grad():
        expected = reference(MNIST(batch).reshape(6, -1))
        assert torch.allclose(linear(out.reshape(6, -1)), expected, rtol=1e-10, atol=1e-10)
    assert repr(normalised) != repr(scattering.GroupNormalised(MNIST, 9)) != repr(MNIST)  # their cache names differ
    with pytest.raises(DpoptError, match=r"^groups=4 must divide the transform's 81 channels$"):
        scattering.GroupNormalised(MNIST, 4)
    with pytest.raises(DpoptError, match=r"^groups=0 must be"):
        scattering.GroupNormalised(MNIST, 0)


def test_computing_features_prints_progress_lines_off_a_terminal(tmp_path, monkeypatch, capsys):
    """Finding (issue 41): ``dpopt reproduce mnist-sota`` printed nothing for the minutes its features took
    (its log held no line until the first runs ended). Off a terminal, with a line due at every
    update, each chunk prints its count, and reading the features back prints none."""
    monkeypatch.setattr(progress, "EVERY_S", 0.0)
    data = images(10, dtype=torch.float32).numpy()
    scattering.features(MNIST, data, name="a", folder=tmp_path, chunk=4)
    lines = capsys.readouterr().err.splitlines()
    want = [f"features of 10 images: {n}/10 images done" for n in (4, 8, 10, 10)]
    assert [line.split(",")[0] for line in lines] == want
    scattering.features(MNIST, data, name="a", folder=tmp_path, chunk=4)
    assert capsys.readouterr().err == ""
