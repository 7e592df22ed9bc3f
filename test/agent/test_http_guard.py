"""The HTTP rules memory-mcp --http and memory-view share: which Host and Origin values name
this server (DNS rebinding is refused), which bind addresses need a token, and the token
comparison."""

from __future__ import annotations

import socket

import pytest

from memory_node.agent.http_guard import (
    bearer_token,
    host_allowed,
    needs_token,
    origin_allowed,
    token_matches,
)


@pytest.mark.parametrize("host", [b"127.0.0.1:8765", b"localhost:8765", b"LOCALHOST",
                                  b"[::1]:8765", b"192.168.1.20:8765", b"10.0.0.7",
                                  b"[fe80::1]:80"])
def test_loopback_names_and_ip_literals_are_ours(host):
    assert host_allowed(host, "127.0.0.1")


@pytest.mark.parametrize("host", [b"evil.example.com", b"evil.example.com:8765",
                                  b"localhost.evil.example.com", b"127.0.0.1.nip.io:8765",
                                  b"", None])
def test_foreign_names_are_refused(host):
    assert not host_allowed(host, "127.0.0.1")


def test_the_machines_own_name_and_the_bind_address_are_ours():
    name = socket.gethostname().lower()
    assert host_allowed(f"{name}:8765".encode(), "0.0.0.0")
    assert host_allowed(b"robot.lan:8765", "robot.lan")
    assert not host_allowed(b"robot.lan:8765", "0.0.0.0")


def test_origin_must_be_the_requests_own_host():
    assert origin_allowed(None, b"127.0.0.1:8765")
    assert origin_allowed(b"http://127.0.0.1:8765", b"127.0.0.1:8765")
    assert not origin_allowed(b"http://127.0.0.1:9999", b"127.0.0.1:8765")
    assert not origin_allowed(b"http://evil.example.com", b"127.0.0.1:8765")
    assert not origin_allowed(b"null", b"127.0.0.1:8765")
    assert not origin_allowed(b"file://", b"127.0.0.1:8765")


@pytest.mark.parametrize(("host", "needed"), [("127.0.0.1", False), ("localhost", False),
                                              ("::1", False), ("127.0.0.2", False),
                                              ("0.0.0.0", True), ("::", True),
                                              ("192.168.1.20", True), ("robot.lan", True)])
def test_anything_but_loopback_needs_a_token(host, needed):
    assert needs_token(host) is needed


def test_tokens_compare_exactly_and_never_empty():
    assert token_matches("abc", "abc") and token_matches(b"abc", "abc")
    assert not token_matches("abd", "abc") and not token_matches("ab", "abc")
    assert not token_matches("", "") and not token_matches(None, "abc")
    scope = {"headers": [(b"authorization", b"Bearer  s3cret ")]}
    assert bearer_token(scope) == b"s3cret"
    assert bearer_token({"headers": [(b"authorization", b"Basic s3cret")]}) is None
    assert bearer_token({"headers": []}) is None
