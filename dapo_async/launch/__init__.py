"""Launch and operate: `dapo-async train` (all roles on one machine), per-role entry helpers,
evaluation, dashboards and reports."""
