"""The 2-D scattering transform of images: a fixed, public filter bank (no privacy cost).

Mallat 2012 ("Group invariant scattering"), Bruna & Mallat 2013, Oyallon & Mallat 2015 ("Deep
roto-translation scattering for object classification"), with the filters and the algorithm of
kymatio (Andreux et al. 2020, "Kymatio: scattering transforms in Python", JMLR), the features of
Tramèr & Boneh 2021 ("Differentially private learning needs better features (or much more
data)", ICLR): for J scales and L angles,

    S0 x = x ⋆ φ_J                          (subsampled by 2^J)
    S1 x = |x ⋆ ψ_{j1,θ1}| ⋆ φ_J            j1 < J, θ1 < L
    S2 x = ||x ⋆ ψ_{j1,θ1}| ⋆ ψ_{j2,θ2}| ⋆ φ_J      j1 < j2 < J

1 + J·L + L²·J(J−1)/2 channels per input channel (81 for J = 2, L = 8) of size H/2^J × W/2^J
(7 × 7 for MNIST's 28 × 28). The filters are defined on the image reflect-padded to
((H + 2^J) // 2^J + 1)·2^J pixels per side (36 for 28), periodic there:

* Gabor g(u) = Σ_{k∈{−2..2}²} exp(−(u+kM)ᵀ Σ (u+kM) + i ξ ⟨u + kM, (cos θ, sin θ)⟩) / (2π σ² / s),
  Σ = R_θ diag(1, s²) R_θᵀ / (2σ²);
* Morlet ψ = g_ξ − (Σ_u g_ξ / Σ_u g_0) g_0 (zero mean), with σ = 0.8·2^j, ξ = 3π/(4·2^j),
  slant s = 4/L, angle (⌊L/2⌋ − 1 − θ)·π/L;
* low-pass φ = g with σ = 0.8·2^(J−1), ξ = 0, s = 1.

Convolutions are products in Fourier (each filter's DFT, real part); subsampling by k is the
mean of the k² aliased copies of the spectrum (the DFT of the subsampled signal); a filter
applied at resolution 2^−r is its spectrum cropped to the low frequencies and folded. The
output is cropped by one pixel on each side of the subsampled padded image.

The transform acts on each image alone with public constants: computing it on private records
and training on the result releases nothing more than training on the images. Features of a
data set are computed once and kept in the cache folder (:func:`features`), named by the data's
digest and the transform's parameters.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from . import _validate, cache, checkpoint, progress

#: Raised when the way the transform is computed changes (part of the cache's file names).
VERSION = 1


def gabor(M: int, N: int, sigma: float, theta: float, xi: float, slant: float = 1.0) -> np.ndarray:
    """The Gabor filter above on the periodic M × N grid (origin at [0, 0]), complex128."""
    rotation = np.array([[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]])
    curvature = rotation @ np.diag([1.0, slant ** 2]) @ rotation.T / (2 * sigma ** 2)
    copies = np.arange(-2, 3)   # the 5 × 5 periodic copies nearest the grid
    x, y = np.arange(M)[:, None] + M * copies[None, :], np.arange(N)[:, None] + N * copies[None, :]
    xx, yy = x[:, None, :, None], y[None, :, None, :]   # [M, N, 5, 5]
    arg = -(curvature[0, 0] * xx * xx + (curvature[0, 1] + curvature[1, 0]) * xx * yy + curvature[1, 1] * yy * yy)
    arg = arg + 1j * xi * (xx * math.cos(theta) + yy * math.sin(theta))
    return np.exp(arg).sum(axis=(2, 3)) / (2 * math.pi * sigma ** 2 / slant)


def morlet(M: int, N: int, sigma: float, theta: float, xi: float, slant: float) -> np.ndarray:
    """The zero-mean Morlet wavelet: the Gabor filter less its envelope times the ratio of their sums."""
    wave, envelope = gabor(M, N, sigma, theta, xi, slant), gabor(M, N, sigma, theta, 0.0, slant)
    return wave - wave.sum() / envelope.sum() * envelope


def periodized(spectrum: np.ndarray, res: int) -> np.ndarray:
    """``spectrum`` at resolution 2^−res: its middle frequencies removed, then folded onto
    (M/2^res) × (N/2^res) (the filter applied to a signal subsampled by 2^res)."""
    M, N = spectrum.shape
    k = 2 ** res
    mask = np.ones(spectrum.shape)
    mask[int(M * 2 ** (-res - 1)):int(M * 2 ** (-res - 1)) + int(M * (1 - 2 ** -res)), :] = 0
    mask[:, int(N * 2 ** (-res - 1)):int(N * 2 ** (-res - 1)) + int(N * (1 - 2 ** -res))] = 0
    return (spectrum * mask).reshape(k, M // k, k, N // k).sum(axis=(0, 2))


def padded_size(side: int, J: int) -> int:
    """The padded side: ((side + 2^J) // 2^J + 1)·2^J."""
    return ((side + 2 ** J) // 2 ** J + 1) * 2 ** J


@dataclasses.dataclass(frozen=True)
class Scattering2D:
    """The scattering transform of order 2 of ``shape`` = (H, W) images with ``J`` scales and
    ``L`` angles. Calling it on ``[B, H, W]`` or ``[B, C, H, W]`` gives ``[B, C·K, H/2^J,
    W/2^J]`` (:attr:`channels` = K per input channel), in the input's dtype (float32 or float64)."""

    shape: tuple[int, int]
    J: int = 2
    L: int = 8

    def __post_init__(self) -> None:
        _validate.positive_int("J", self.J)
        _validate.positive_int("L", self.L)
        for side in self.shape:
            _validate.positive_int("shape", side)
            if side % 2 ** self.J or side < 2 ** self.J:
                raise _validate.DpoptError(f"shape={self.shape} must be multiples of 2^J = {2 ** self.J}")

    @property
    def channels(self) -> int:
        """K = 1 + J·L + L²·J(J−1)/2 output channels per input channel."""
        return 1 + self.J * self.L + self.L ** 2 * self.J * (self.J - 1) // 2

    @property
    def output_shape(self) -> tuple[int, int]:
        return self.shape[0] // 2 ** self.J, self.shape[1] // 2 ** self.J

    @functools.cached_property
    def _filters(self) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
        """(φ at resolutions 0..J−1, ψ per scale j: [L, M_r, N_r] spectra at resolutions 0..j), real."""
        M, N = (padded_size(side, self.J) for side in self.shape)
        phi = np.real(np.fft.fft2(gabor(M, N, 0.8 * 2 ** (self.J - 1), 0.0, 0.0)))
        psi = [[np.real(np.fft.fft2(morlet(M, N, 0.8 * 2 ** j, (self.L // 2 - 1 - theta) * math.pi / self.L,
                                          3 / 4 * math.pi / 2 ** j, 4 / self.L))) for theta in range(self.L)]
               for j in range(self.J)]
        return ([periodized(phi, res) for res in range(self.J)],
                [[np.stack([periodized(p, res) for p in by_angle]) for res in range(j + 1)] for j, by_angle in
                 enumerate(psi)])

    def filters(self, dtype: torch.dtype) -> tuple[list[Tensor], list[list[Tensor]]]:
        """The spectra of :attr:`_filters` as tensors of ``dtype``."""
        phi, psi = self._filters
        return ([torch.as_tensor(f, dtype=dtype) for f in phi],
                [[torch.as_tensor(f, dtype=dtype) for f in levels] for levels in psi])

    def __call__(self, images: Tensor) -> Tensor:
        if images.shape[-2:] != torch.Size(self.shape) or images.ndim not in (3, 4):
            raise _validate.DpoptError(f"images of shape {tuple(images.shape)} must be [B, H, W] or [B, C, H, W] with "
                                       f"(H, W) = {self.shape}")
        if not images.dtype.is_floating_point:
            raise _validate.DpoptError(f"images of dtype {images.dtype} must be floating point")
        batch = images.shape[0]
        x = images.reshape(-1, 1, *self.shape)
        M, N = (padded_size(side, self.J) for side in self.shape)
        top, left = (M - self.shape[0]) // 2, (N - self.shape[1]) // 2
        x = torch.nn.functional.pad(x, (left, N - self.shape[1] - left, top, M - self.shape[0] - top),
                                    mode="reflect")[:, 0]
        phi, psi = self.filters(images.dtype)
        U0 = torch.fft.fft2(x)
        out = [_low_pass(U0, phi[0], 2 ** self.J)[:, None]]
        first: list[Tensor] = []    # per j1: |x ⋆ ψ_j1|'s spectrum [B, L, ·, ·]
        for j1 in range(self.J):
            U1 = _subsample(_filtered(U0[:, None], psi[j1][0]), 2 ** j1)
            first.append(torch.fft.fft2(torch.fft.ifft2(U1).abs()))
            out.append(_low_pass(first[j1], phi[j1], 2 ** (self.J - j1)))
        for j1 in range(self.J):
            second = []
            for j2 in range(j1 + 1, self.J):   # [B, L(θ1), L(θ2), ·, ·]
                U2 = _subsample(_filtered(first[j1][:, :, None], psi[j2][j1]), 2 ** (j2 - j1))
                second.append(_low_pass(torch.fft.fft2(torch.fft.ifft2(U2).abs()), phi[j2], 2 ** (self.J - j2)))
            if second:
                joined = torch.cat(second, dim=2)
                out.append(joined.reshape(joined.shape[0], -1, *joined.shape[-2:]))
        return torch.cat(out, dim=1).reshape(batch, -1, *self.output_shape)


def _subsample(spectrum: Tensor, k: int) -> Tensor:
    """The spectrum of the signal subsampled by ``k`` in both spatial dims: the mean of its k²
    aliased copies (added block by block, in a fixed order)."""
    if k == 1:
        return spectrum
    m, n = spectrum.shape[-2] // k, spectrum.shape[-1] // k
    rows = functools.reduce(torch.add, [spectrum[..., i * m:(i + 1) * m, :] for i in range(k)])
    return functools.reduce(torch.add, [rows[..., j * n:(j + 1) * n] for j in range(k)]) / k ** 2


def _filtered(spectrum: Tensor, filters: Tensor) -> Tensor:
    """``spectrum`` (complex) times the real ``filters`` (broadcast), as real products."""
    real = torch.view_as_real(spectrum)
    return torch.view_as_complex((real * filters[..., None]).contiguous())


def _low_pass(spectrum: Tensor, phi: Tensor, k: int) -> Tensor:
    """(signal ⋆ φ) subsampled by ``k``, real, cropped by one pixel on each side."""
    return torch.fft.ifft2(_subsample(_filtered(spectrum, phi), k)).real[..., 1:-1, 1:-1]


@dataclasses.dataclass(frozen=True)
class GroupNormalised:
    """``transform`` followed by GroupNorm without affine parameters: each image's output channels,
    in ``groups`` consecutive groups, shifted and scaled to mean 0 and variance 1 within each group
    (1e−5 added to the variance, as ``torch.nn.GroupNorm``). Like the transform, a fixed map of each
    image alone: computed with the features, once (:func:`features`), it costs no privacy and
    spares a model the normalisation at every step (``make_model("linear")`` on its output is
    ``make_model("scatternet-linear", groups=groups)`` on the transform's)."""

    transform: Scattering2D
    groups: int

    def __post_init__(self) -> None:
        _validate.positive_int("groups", self.groups)
        channels = self.transform.channels
        if channels % self.groups:
            raise _validate.DpoptError(f"groups={self.groups!r} must divide the transform's {channels} channels")

    def __call__(self, images: Tensor) -> Tensor:
        return torch.nn.functional.group_norm(self.transform(images), self.groups)


# ------------------------------------------------------------------------------ the cache


def features(transform: Callable[[Tensor], Tensor], images: np.ndarray, *, name: str, chunk: int = 32,
             folder: Path | None = None) -> Tensor:
    """``transform`` of every image of ``images`` (float32, ``[n, …]``), flattened to one row per
    image, computed in chunks of ``chunk`` images and kept in ``folder`` (default
    ``<cache folder>/features``, :func:`dpopt.cache.folder`) under a name made of the images'
    sha256 (their bytes, dtype and shape) and ``name`` (the transform's parameters): computed once
    per data set and transform, read back afterwards (in dpopt's checkpoint format: its digest is
    checked, and a damaged file is computed again). Computing them prints progress lines on standard
    error (:func:`dpopt.progress.bar`): counts and times only."""
    images = np.ascontiguousarray(images, dtype=np.float32)
    if len(images) == 0:
        raise _validate.DpoptError("images must hold at least one image")
    digest = hashlib.sha256(f"{images.shape}".encode() + images.tobytes()).hexdigest()
    key = hashlib.sha256(f"{name} v{VERSION} float32 {digest}".encode()).hexdigest()[:32]
    path = (folder if folder is not None else cache.folder() / "features") / f"{key}.pt"
    if path.exists():
        try:
            return checkpoint.load(path)
        except _validate.DpoptError:
            pass  # damaged: computed again below
    with torch.inference_mode(), progress.bar(len(images), desc=f"features of {len(images):,} images",
                                              unit="image") as shown:
        first = transform(torch.from_numpy(images[:chunk])).reshape(len(images[:chunk]), -1)
        result = torch.empty(len(images), first.shape[1], dtype=first.dtype)
        result[:len(first)] = first
        shown.update(len(first))
        for start in range(chunk, len(images), chunk):
            batch = images[start:start + chunk]
            result[start:start + len(batch)] = transform(torch.from_numpy(batch)).reshape(len(batch), -1)
            shown.update(len(batch))
    checkpoint.save(path, result)
    return result
