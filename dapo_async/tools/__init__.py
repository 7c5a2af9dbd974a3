"""Commands that look at runs and models from outside the training job: `dapo-async report`
(PNG plots), `dapo-async dashboard` (the Aim UI on loopback), `dapo-async eval` (held-out
avg@k / pass@k of a model directory)."""
