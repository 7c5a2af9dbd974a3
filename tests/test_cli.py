"""The command line: each sub-command's own options, overrides anywhere after the config."""

import pytest

from dapo_async.cli import build_parser, main, parse_args


def test_a_bench_refuses_another_benchs_option(capsys):
    parser = build_parser()
    assert parser.parse_args(["bench", "ablation", "--stream"]).stream
    with pytest.raises(SystemExit):
        main(["bench", "transport", "--stream"])
    err = capsys.readouterr().err
    assert "dapo-async bench transport: error: unrecognized arguments: --stream" in err


def test_overrides_may_follow_options_and_other_words_are_refused(capsys):
    args = parse_args(["tune", "c.yaml", "a.b=1", "--steps", "3", "c.d=2", "--json", "e.f=x"])
    assert args.overrides == ["a.b=1", "c.d=2", "e.f=x"] and args.steps == 3 and args.json
    assert parse_args(["bench", "async", "--rounds", "2", "x.y=1"]).overrides == ["x.y=1"]
    with pytest.raises(SystemExit):
        parse_args(["train", "c.yaml", "--json", "stray"])
    assert "dapo-async train: error: unrecognized arguments: stray" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a command without overrides takes no k=v
        parse_args(["keys", "--out", "d", "a.b=1"])
