"""Example rollout functions (docs/rollouts.md): ``generator.rollout=examples.tool_rollout:rollout``."""
