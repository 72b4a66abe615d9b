"""The terminal chat (``python -m minisgl --shell``) driven through a pseudo-terminal."""

from __future__ import annotations

import sys

import pexpect
import pytest
from server_utils import REPO, server_env

from minisgl.server.shell import ShellSettings


def test_shell_answers_interrupts_resets_and_exits(tmp_path):
    env = server_env(
        MINISGL_SHELL_MAX_TOKENS="400",
        MINISGL_SHELL_HISTORY=str(tmp_path / "history"),
        PROMPT_TOOLKIT_NO_CPR="1",
        TERM="dumb",
    )
    child = pexpect.spawn(
        sys.executable, ["-m", "minisgl", "--shell"], cwd=str(REPO), env=env, encoding="utf-8", timeout=120
    )
    try:
        # the banner names the model, its size and quantisation, how it samples, and a bigger model
        child.expect("SmolLM2-135M-Instruct, 135M parameters")
        child.expect("GGUF Q4_1")
        child.expect("--model Qwen/Qwen3-0.6B")
        child.expect("answers: greedy")
        child.expect("/reset")  # the banner explains the commands
        child.expect("> ")
        child.sendline("What is the capital of France?")
        child.expect("Paris")
        child.expect("> ")
        # multi-turn: the follow-up only makes sense with the first turn in the history
        child.sendline("Repeat the name of that city, nothing else.")
        child.expect("Paris")
        child.expect("> ")
        child.sendline("Write a very long story about a dragon.")
        child.expect("dragon\\.\r*\n")  # the echo of the question
        child.expect(r"\w+ \w+ \w+")  # it is answering
        child.sendintr()  # Ctrl-C stops the answer, not the shell
        child.expect(r"\(interrupted\)")
        child.expect("> ")
        child.sendline("/reset")
        child.expect(r"\(conversation cleared\)")
        child.expect("> ")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
        child.close()
        assert child.exitstatus == 0
        assert "capital of France" in (tmp_path / "history").read_text()  # prompt_toolkit history
    finally:
        if child.isalive():
            child.terminate(force=True)


def test_shell_settings_from_env():
    s = ShellSettings.from_env({"MINISGL_SHELL_MAX_TOKENS": "7", "MINISGL_SHELL_TOP_K": "5"})
    assert s.sampling().max_tokens == 7 and s.sampling().top_k == 5
    # greedy on the embedded model (sampled, it answered "What is the capital of France?" wrongly), 0.6 on others
    assert s.sampling(embedded=True).is_greedy and s.sampling(embedded=False).temperature == 0.6
    assert ShellSettings.from_env({"MINISGL_SHELL_TEMPERATURE": "0.3"}).sampling(embedded=True).temperature == 0.3
    with pytest.raises(ValueError, match="MINISGL_SHELL_TEMPERATURE"):
        ShellSettings.from_env({"MINISGL_SHELL_TEMPERATURE": "warm"})
    with pytest.raises(ValueError, match="top_p"):
        ShellSettings.from_env({"MINISGL_SHELL_TOP_P": "1.5"})
