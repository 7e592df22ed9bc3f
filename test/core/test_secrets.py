"""Secrets are masked wherever the package shows a value: URL passwords, `password=` and
`token=` values, bearer tokens, sk- keys, and whole values of parameters named like secrets."""

from __future__ import annotations

import logging

import pytest
from secret_guard import FLEET_PASSWORD, LLM_API_KEY

from memory_node.core.secrets import SecretFilter, is_secret_name, mask_secrets, mask_value
from memory_node.ros.param_args import command_line_wins

FLEET_URL = f"postgresql://go2-a:{FLEET_PASSWORD}@/postgres?host=/var/run/postgresql"


@pytest.mark.parametrize(("text", "shown"), [
    (FLEET_URL, "postgresql://go2-a:***@/postgres?host=/var/run/postgresql"),
    (f"postgresql://r@h/f?sslmode=require&password={FLEET_PASSWORD}",
     "postgresql://r@h/f?sslmode=require&password=***"),
    (f"host=db password={FLEET_PASSWORD} user=go2", "host=db password=*** user=go2"),
    (f"Authorization: Bearer {LLM_API_KEY}", "Authorization: Bearer ***"),
    (f"Incorrect API key provided: {LLM_API_KEY}.", "Incorrect API key provided: sk-***."),
    (f'{{"api_key": "{LLM_API_KEY}"}}', '{"api_key": "***"}'),
    (f"http://u:{FLEET_PASSWORD}@llm.local/v1?token=abcdef", "http://u:***@llm.local/v1?token=***"),
], ids=["url-password", "password-query", "libpq-keyword", "bearer", "sk-key", "json-api-key",
        "url-and-token"])  # ids of their own: a test id with the secret would print it
def test_secrets_in_text_are_masked(text, shown):
    assert mask_secrets(text) == shown


@pytest.mark.parametrize("text", [
    "memory_dir = /tmp/agent_memory (--memory-dir)", "max_tokens=50",
    "lidar_topic = /utlidar/cloud",
    "postgresql://go2-a@/fleet?host=/run/postgresql", "http://127.0.0.1:8000/v1",
])
def test_text_without_secrets_is_unchanged(text):
    assert mask_secrets(text) == text


def test_values_of_secret_names_are_masked_whole():
    assert [is_secret_name(n) for n in ("api_key", "VLM_API_KEY", "auth_token", "--token",
                                        "fleet_password")] == [True] * 5
    assert [is_secret_name(n) for n in ("max_tokens", "author", "fleet_url", "keyframes")] == \
        [False] * 4
    assert mask_value("view_token", "plain-token-value") == "***"
    assert mask_value("fleet_url", FLEET_URL) == mask_secrets(FLEET_URL)
    assert mask_value("api_key", "") == ""


def test_the_start_line_masks_a_password_typed_on_the_command_line():
    """Issue 40: the line naming each value's origin printed the fleet password."""
    args = ["memory-server", "--ros-args", "-p", "backend:=fleet", "-p", f"fleet_url:={FLEET_URL}",
            "-p", "vlm_api_key:=typed-key-value"]
    line = command_line_wins(args, ["memory_server"]).start_line()
    assert FLEET_PASSWORD not in line and "typed-key-value" not in line
    assert "fleet_url = postgresql://go2-a:***@/postgres?host=/var/run/postgresql (command line)" \
        in line
    assert "vlm_api_key = *** (command line)" in line


def test_a_log_record_with_a_secret_is_masked_by_the_filter():
    record = logging.LogRecord("memory_node", logging.WARNING, __file__, 1,
                               "summary failed: %s", (f"bad key {LLM_API_KEY}",), None)
    assert SecretFilter().filter(record)
    assert record.getMessage() == "summary failed: bad key sk-***"
