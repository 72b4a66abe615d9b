"""``python -m minisgl``: serve a model over HTTP (OpenAI-compatible), or chat with it (``--shell``)."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from minisgl.env import ENV
    from minisgl.server.args import parse_args

    args = parse_args(argv)
    try:
        ENV.check()
    except ValueError as e:
        print(f"minisgl: {e}", file=sys.stderr)
        return 2
    if args.shell:
        from minisgl.server.shell import run_shell

        return run_shell(args)
    from minisgl.server.ops.dp import launch_dp, routed

    if routed(args):
        return launch_dp(args, sys.argv[1:] if argv is None else argv)
    from minisgl.server.launch import launch

    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
