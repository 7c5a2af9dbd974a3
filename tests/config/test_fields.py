"""Each field's declared rule (``F(..., ge=…, choices=…)``) is enforced by ``RunConfig.check``
with an error naming the dotted key, and stated in the generated docs."""

import ast
import dataclasses

import pytest

from dapo_async import config as C
from dapo_async.config.fields import Valid


def _outside(rule: Valid, default):
    """A value of the default's type that the rule must refuse."""
    if rule.choices:
        return "no-such-choice"
    if rule.nonempty:
        return ""
    low = rule.ge if rule.ge is not None else rule.gt
    below = low - 1 if rule.ge is not None else low
    if low is not None:
        return type(default)(below)
    high = rule.le if rule.le is not None else rule.lt
    return type(default)(high + 1 if rule.le is not None else high)


def _ruled_fields():
    rows, cfg = [], C.RunConfig()
    for section in dataclasses.fields(cfg):
        sub = getattr(cfg, section.name)
        if dataclasses.is_dataclass(sub):
            rows += [(section.name, f.name, f.metadata["valid"]) for f in dataclasses.fields(sub)
                     if "valid" in f.metadata]  # fmt: skip
        elif "valid" in section.metadata:
            rows.append(("", section.name, section.metadata["valid"]))
    return rows


RULED = _ruled_fields()


def test_most_single_field_rules_are_declared():
    assert len(RULED) > 60


@pytest.mark.parametrize("section,name,rule", RULED, ids=[f"{s}.{n}" for s, n, _ in RULED])
def test_every_declared_rule_refuses_a_value_outside_it(repo, section, name, rule):
    cfg = C.load_config(repo / "configs" / "tiny_cpu.yaml")
    target = getattr(cfg, section) if section else cfg
    default = getattr(target, name)
    assert rule.accepts(default), "the default itself must be valid"
    setattr(target, name, _outside(rule, default))
    with pytest.raises(C.ConfigError) as e:
        cfg.check()
    key = f"{section}.{name}" if section else name
    assert e.value.key == key and rule.describe() in str(e.value)


@pytest.mark.parametrize(
    "rule,words,inside,outside",
    [
        (Valid(ge=1), ">= 1", [1, 5], [0, -3]),
        (Valid(gt=0), "> 0", [1e-9, 2], [0, -1]),
        (Valid(ge=0, le=1), "in [0, 1]", [0, 1, 0.5], [-0.1, 1.1]),
        (Valid(gt=0, le=1), "in (0, 1]", [1, 0.3], [0, 1.5]),
        (Valid(ge=0, lt=1), "in [0, 1)", [0, 0.99], [1, -1]),
        (Valid(choices=("a", "b")), "one of ['a', 'b']", ["a", "b"], ["c", ""]),
        (Valid(nonempty=True), "not empty", ["x"], [""]),
    ],
)
def test_rule_words_and_bounds(rule, words, inside, outside):
    assert rule.describe() == words
    assert all(rule.accepts(v) for v in inside)
    assert not any(rule.accepts(v) for v in outside)


def test_choice_error_says_what_it_got(repo):
    with pytest.raises(C.ConfigError) as e:
        C.load_config(repo / "configs" / "tiny_cpu.yaml", ["generator.mode=burst"])
    assert e.value.key == "generator.mode"
    assert "one of ['batch', 'stream']" in str(e.value) and "'burst'" in str(e.value)


def test_config_docs_state_the_accepted_values():
    rows = {key: accepts for key, _, _, accepts in C.field_docs()}
    assert rows["learner.num_steps"] == ">= 1"
    assert rows["generator.top_p"] == "in (0, 1]"
    assert rows["seed"] == ""


def test_choice_states_each_value_once_in_doc_and_rule():
    """``Choice`` builds the doc and the rule from one declaration: every value, in order,
    with its meaning where it has one."""
    from dapo_async.config.fields import Choice

    f = Choice("Transport", "dist", dist="torch.distributed group", disk="")
    assert f.default == "dist"
    assert f.metadata["doc"] == "Transport: dist (torch.distributed group) | disk."
    assert f.metadata["valid"].choices == ("dist", "disk")
    shared = Choice("Dtype", "auto", ("auto", "float32"), auto="per device")
    assert shared.metadata["doc"] == "Dtype: auto (per device) | float32."
    assert shared.metadata["valid"].choices == ("auto", "float32")


@pytest.mark.parametrize(
    "args, meanings",
    [(("T", "nope", ("a", "b")), {}), (("T", "a", ("a", "b")), {"c": "not a value"})],
)
def test_choice_refuses_a_declaration_the_rule_would_contradict(args, meanings):
    from dapo_async.config.fields import Choice

    with pytest.raises(AssertionError):
        Choice(*args, **meanings)


def test_generated_docs_list_every_choice_field_value():
    """Every choice field's doc names each of its accepted values (so the table and the check
    say the same thing)."""
    checked = 0
    for key, doc, _, accepts in C.field_docs():
        if accepts.startswith("one of "):
            checked += 1
            for value in ast.literal_eval(accepts[len("one of ") :]):
                assert value in doc, (key, value)
    assert checked >= 15
