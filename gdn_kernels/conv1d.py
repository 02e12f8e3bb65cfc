"""Causal depthwise Conv1D + SiLU: forward and the decoupled backward.

The conv runs over the EXTENDED input ext [B, K-1+T, C]: the K-1 inputs
before the row (carried history, or zeros), then the row's T inputs. Row
token t reads ext[t .. t+K-1].

The backward is a plain-JAX multiply-add over taps, independent of the
recurrence kernels ("decoupled"): it runs after the delta-rule backward,
from the pre-activation recomputed from ext. Each tap's cotangent is PADDED
into the extended positions, never read through a slice of ext: XLA:CPU
emits a sum over (batch, time) of a product with a time-sliced 3-D operand
as a scalar loop, several times slower than the same sum over a padded
operand (benchmarks/README.md, "Numbers behind the kernels' comments").
It walks the row in blocks of TIME_BLOCK tokens (at least K-1: the first
block, then a loop, then the last, shorter block), so each tap's padded
cotangent is a block-sized temporary
that stays in cache instead of a fresh [B, K-1+T, C] buffer per tap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from .manual_axes import varying_like

# Tokens per block of the backward's walk over the row (at least K-1).
TIME_BLOCK = 64


def _tap(x, valid, j):
    """x where tap j is valid (valid [K, B, T] bool or None: all valid)."""
    return x if valid is None else jnp.where(valid[j][..., None], x, 0.0)


def _row_valid(valid, width: int):
    """valid [K, B, K-1+T] (extended positions) -> [K, B, T] (row tokens)."""
    return None if valid is None else valid[:, :, width - 1:]


def _placed(x, j: int, width: int):
    """x [B, T, C] at extended positions j .. j+T-1 of [B, K-1+T, C], zeros
    elsewhere (row token t's tap j reads extended position t + j)."""
    return jnp.pad(x, ((0, 0), (j, width - 1 - j), (0, 0)))


def conv1d_preactivation(ext, weight, valid=None):
    """pre[b,t,c] = sum_j weight[j,c] * ext[b, t+j, c].

    ext [B, K-1+T, C] (history, then the row), weight [K, C], both already
    in the accumulation dtype; valid [K, B, K-1+T] bool or None: tap j of
    the token at extended position p reads only where valid[j, b, p]
    (packed documents, segments.ConvWindows). Returns [B, T, C].
    """
    return _preactivation(ext, weight, _row_valid(valid, weight.shape[0]))


def _preactivation(ext, weight, valid):
    """conv1d_preactivation with valid [K, B, T] (row tokens) or None."""
    width = weight.shape[0]
    t = ext.shape[1] - (width - 1)
    pre = jnp.zeros(ext.shape[:1] + (t,) + ext.shape[2:], ext.dtype)
    for j in range(width):
        pre = pre + weight[j] * _tap(ext[:, j:j + t], valid, j)
    return pre


def silu_grad(z):
    """d silu(z) / dz = sigmoid(z) (1 + z (1 - sigmoid(z)))."""
    s = jax.nn.sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def _block_backward(ext, weight, dy, valid):
    """conv1d_silu_backward of one block of n tokens: ext [B, K-1+n, C] (the
    block's extended window), dy [B, n, C], valid [K, B, n] or None.
    Returns (the window's dext [B, K-1+n, C], dw [K, C])."""
    width = weight.shape[0]
    dpre = dy * silu_grad(_preactivation(ext, weight, valid))
    dext = jnp.zeros_like(ext)
    dw = []
    for j in range(width):
        dpre_j = _placed(_tap(dpre, valid, j), j, width)
        dext = dext + weight[j] * dpre_j
        dw.append(jnp.sum(dpre_j * ext, axis=(0, 1)))
    return dext, jnp.stack(dw, axis=0)


def conv1d_silu_backward(ext, weight, dy, valid=None):
    """Cotangents of ext [B, K-1+T, C] and weight [K, C] of
    silu(conv1d_preactivation(ext, weight, valid)) given dy [B, T, C] (valid
    as in conv1d_preactivation; packed rows: ext and dy in compact order).
    With dpre = dy silu'(pre), pre recomputed from ext:

    dext[b,p,c] = sum_j weight[j,c] * (valid_j dpre)[b, p-j, c]
    dw[j,c]     = sum_{b,t} (valid_j dpre)[b,t,c] * ext[b, t+j, c]

    Returns (dhist [B, K-1, C], drow [B, T, C], dw): dext split into its
    history and row parts (drow is written in place, no [B, K-1+T, C] buffer
    and no copy out of it). Block by block (TIME_BLOCK tokens): a block's
    window reaches K-1 positions back, into the previous block's rows (or
    the history, for the first block), whose dext both add to. A block
    is at least K-1 tokens long, so a window never reaches past the previous
    block into the history.
    """
    history = weight.shape[0] - 1
    valid = _row_valid(valid, history + 1)
    t = dy.shape[1]
    block_len = max(TIME_BLOCK, history)
    n_blocks, tail = divmod(t, block_len)

    def block(start, n):
        """(dext [B, K-1+n, C], dw) of the n tokens from start."""
        window = lambda x, size, axis: lax.dynamic_slice_in_dim(x, start, size, axis)
        return _block_backward(window(ext, n + history, 1), weight, window(dy, n, 1),
                               None if valid is None else window(valid, n, 2))

    def add_block(carry, start, n):
        drow, dw = carry
        block_dext, block_dw = block(start, n)
        at = start - history
        block_dext = block_dext + lax.dynamic_slice_in_dim(drow, at, n + history, 1)
        return lax.dynamic_update_slice_in_dim(drow, block_dext, at, 1), dw + block_dw

    dext, dw = block(0, min(t, block_len))
    drow = varying_like(jnp.zeros(dy.shape[:2] + ext.shape[2:], ext.dtype), ext, weight, dy)
    carry = (lax.dynamic_update_slice_in_dim(drow, dext[:, history:], 0, 1), dw)
    if n_blocks > 1:
        carry = lax.fori_loop(1, n_blocks,
                              lambda i, c: add_block(c, i * block_len, block_len), carry)
    if n_blocks and tail:
        carry = add_block(carry, n_blocks * block_len, tail)
    return (dext[:, :history],) + carry
