"""Issue 40: the LLM key stays out of every output and log of a running memory-node, even
when the endpoint echoes it back in an error (as some providers do for a wrong key)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import rclpy
from chat_server import ChatServer
from secret_guard import LLM_API_KEY

from memory_node.ros.cli import ServiceCaller
from memory_node.sim.chat_endpoint import completion


class EchoingEndpoint(ChatServer):
    """Refuses the first request with an error that quotes the key, then answers."""

    def answer(self, body, request=None):
        self.requests.append({"auth": request.headers["Authorization"], "body": body})
        if len(self.requests) == 1:
            return 401, {"error": {"message": f"Incorrect API key provided: {LLM_API_KEY}.",
                                   "type": "invalid_request_error"}}
        return 200, completion({"role": "assistant", "content": "- met Alice at the door"},
                               id="chat-1", object="chat.completion", model=body.get("model"))


def _memory_node() -> list[str]:
    exe = Path(sys.executable).parent / "memory-node"
    return [str(exe)] if exe.exists() else ["-m", "memory_node.ros.main"]


def test_an_echoed_llm_key_reaches_no_output_or_log(ros_process, tmp_path):
    with EchoingEndpoint(lambda body: {}) as srv:
        env = {"VLM_BASE_URL": srv.base_url, "VLM_API_KEY": LLM_API_KEY, "VLM_MODEL": "gpt-5.5"}
        proc = ros_process([*_memory_node(), "--memory-dir", str(tmp_path / "mem"),
                            "--ros-args", "-p", "summary_age_s:=0.0"], env=env)
        proc.wait_for_line(r"active: /memory/search", timeout=90)
        ctx = rclpy.Context()
        rclpy.init(context=ctx)
        caller = ServiceCaller("llm_secrets_client", context=ctx)
        try:
            saved = json.loads(caller.call("save", "Met Alice at the front door.", 30.0))
            failed = caller.call("compact", None, 60.0)
            written = caller.call("compact", None, 60.0)
        finally:
            caller.close()
            rclpy.shutdown(context=ctx)
        assert saved["ok"], saved
        assert srv.requests and srv.requests[0]["auth"] == f"Bearer {LLM_API_KEY}"
    failed_ans, written_ans = json.loads(failed), json.loads(written)
    assert failed_ans["ok"], failed_ans
    assert written_ans["ok"], written_ans
    assert LLM_API_KEY not in failed + written
    assert "401" in failed, failed  # the refusal is reported, its key is not
    assert LLM_API_KEY not in proc.output


def test_a_node_logger_masks_secrets_at_every_level(capfd):
    """The nodes' loggers mask what they log; one node logs at several severities in turn
    (rclpy refuses a call site that changes severity, so each level is a site of its own)."""
    from memory_node.ros.common import MaskedLogger

    ctx = rclpy.Context()
    rclpy.init(context=ctx)
    node = rclpy.create_node("masked_logger_test", context=ctx)
    try:
        log = MaskedLogger(node.get_logger())
        for _ in range(2):
            log.warning(f"fleet at postgresql://go2-a:{LLM_API_KEY}@db/fleet unreachable")
            log.info(f"key {LLM_API_KEY}")
            log.error(f"Authorization: Bearer {LLM_API_KEY}")
    finally:
        node.destroy_node()
        rclpy.shutdown(context=ctx)
    out = capfd.readouterr()
    text = out.out + out.err
    assert LLM_API_KEY not in text
    assert text.count("postgresql://go2-a:***@db/fleet") == 2 and text.count("Bearer ***") == 2
