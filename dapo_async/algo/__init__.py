"""Pure learning math (no I/O): advantages, losses, KL, DPO, filters, overlong shaping.

Import the submodules directly (``from dapo_async.algo.losses import policy_loss``): this
package imports nothing itself, so the buffer can use ``algo.filters`` (numpy only) without
pulling in torch. See docs/algorithms.md for the formulas and the config keys that select them.
"""
