import pytest

from plumbing.env import env_bool, env_float, env_int, env_list, env_str


def test_it_uses_the_default_when_the_variable_is_unset(monkeypatch):
    monkeypatch.delenv("GS_X", raising=False)
    assert env_str("GS_X", "a") == "a"
    assert env_int("GS_X", 3) == 3
    assert env_float("GS_X", 0.5) == 0.5
    assert env_bool("GS_X", True) is True
    assert env_list("GS_X", ["a"]) == ["a"]


def test_it_parses_set_values(monkeypatch):
    monkeypatch.setenv("GS_X", "7")
    assert env_int("GS_X", 3) == 7
    monkeypatch.setenv("GS_X", "off")
    assert env_bool("GS_X", True) is False
    monkeypatch.setenv("GS_X", "a, b,,c")
    assert env_list("GS_X", []) == ["a", "b", "c"]


def test_it_names_the_variable_in_a_parse_error(monkeypatch):
    monkeypatch.setenv("GS_X", "many")
    with pytest.raises(ValueError, match="GS_X must be an integer"):
        env_int("GS_X", 1)
    monkeypatch.setenv("GS_X", "maybe")
    with pytest.raises(ValueError, match="GS_X must be a boolean"):
        env_bool("GS_X", False)
