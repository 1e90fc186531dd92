"""The float64 truth: convolution and max-pooling in numpy, in the input's dtype.

Every GPU output is checked against these; they are written for clarity and bounded memory,
not speed (im2col in chunks, or shifted GEMMs when one image's columns are too large).
"""
from __future__ import annotations

import numpy as np

from convsweep.base.errors import ShapeError

CONV_CHUNK_ELEMENTS = 1 << 22  # bounds the im2col buffer (32 MiB in float64) however large the batch


def conv2d_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int = 1) -> np.ndarray:
    """Valid convolution y[b,m,h,w] = bias[m] + sum x[b,c,h*S+p,w*S+q] k[m,c,p,q], in x's dtype.

    im2col + one GEMM per image, in chunks so the column buffer stays bounded for any batch.
    """
    if x.ndim != 4 or w.ndim != 4 or b.ndim != 1:
        raise ShapeError(
            f"conv2d_reference: expected x [B,C,H,W], w [M,C,K,K], b [M]; got {x.shape}, {w.shape}, {b.shape}"
        )
    batch, c, h, width = x.shape
    m, wc, k, k2 = w.shape
    if wc != c or k != k2 or b.shape[0] != m:
        raise ShapeError(f"conv2d_reference: x {x.shape} does not fit w {w.shape} and b {b.shape}")
    if k > h or k > width:
        raise ShapeError(f"conv2d_reference: kernel {k} larger than the input {h}x{width}")
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.dtype(np.float64)
    s = stride
    h_out, w_out = (h - k) // s + 1, (width - k) // s + 1
    kernel_matrix = w.reshape(m, c * k * k).astype(dtype)
    bias = b.astype(dtype)[:, None]
    out = np.empty((batch, m, h_out, w_out), dtype=dtype)
    per_image = c * k * k * h_out * w_out
    if per_image > CONV_CHUNK_ELEMENTS:  # one image's columns alone are too large: shift and multiply
        return _conv2d_by_offsets(x.astype(dtype, copy=False), w.astype(dtype), bias, s, h_out, w_out)
    chunk = max(1, min(256, CONV_CHUNK_ELEMENTS // per_image))
    for start in range(0, batch, chunk):
        xs = x[start : start + chunk].astype(dtype, copy=False)
        windows = np.lib.stride_tricks.sliding_window_view(xs, (k, k), axis=(2, 3))[:, :, ::s, ::s]
        # [n, C, K, K, H_out, W_out] keeps the long W_out run innermost, so the copy streams.
        columns = np.ascontiguousarray(windows.transpose(0, 1, 4, 5, 2, 3))
        columns = columns.reshape(len(xs), c * k * k, h_out * w_out)
        result = np.matmul(kernel_matrix, columns)
        result += bias
        out[start : start + chunk] = result.reshape(len(xs), m, h_out, w_out)
    return out


def _conv2d_by_offsets(x, w, bias, s, h_out, w_out):
    """y = bias + sum over (p, q) of k[:, :, p, q] @ x shifted by (p, q): K*K GEMMs, no column buffer.

    For large layers (256 channels on 228x228): memory stays one shifted input per image.
    """
    m, c, k, _ = w.shape
    out = np.empty((len(x), m, h_out * w_out), dtype=x.dtype)
    for i, image in enumerate(x):
        acc = np.repeat(bias, h_out * w_out, axis=1)
        for p in range(k):
            for q in range(k):
                shifted = np.ascontiguousarray(image[:, p : p + s * h_out : s, q : q + s * w_out : s]).reshape(c, -1)
                acc += w[:, :, p, q] @ shifted
        out[i] = acc
    return out.reshape(len(x), m, h_out, w_out)


def maxpool2d_reference(x: np.ndarray, size: int, stride: int) -> np.ndarray:
    """Max over size x size windows at `stride`, dropping a partial last window (floor)."""
    h_out = (x.shape[2] - size) // stride + 1
    w_out = (x.shape[3] - size) // stride + 1
    # One elementwise maximum per window offset: numpy reduces strided slices far faster than windows.
    out = x[:, :, : stride * h_out : stride, : stride * w_out : stride].copy()
    for p in range(size):
        for q in range(size):
            np.maximum(out, x[:, :, p : p + stride * h_out : stride, q : q + stride * w_out : stride], out=out)
    return out
