"""The evaluator role: periodic held-out evaluation off the learner's critical path."""
