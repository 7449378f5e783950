"""A reward server for grpo.reward: {url: ...}, on the standard library only.

    python examples/toy-rewards/server.py --port 8000      # then grpo.reward: {url: "http://127.0.0.1:8000/score"}

It answers the job's POSTs (docs/rl.md, "A reward server"): the body is {"samples": [{"prompt", "response",
"response_ids", "record"}, ...]}, the answer {"scores": [...]}, one entry per sample, in order: a number, or an
object with the number under "score" and other numbers, reported as reward/NAME metrics. It scores as digits.py
does; a real server would run tests or ask a judge model here, and may take its time (grpo.reward.timeout_s).
"""

from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def score(sample: dict) -> dict[str, float]:
    visible = [c for c in sample["response"] if not c.isspace()]
    digits = sum(c in "0123456789" for c in visible)
    return {"score": digits / len(visible) if visible else 0.0, "digits": float(digits)}


class RewardHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            scores = [score(sample) for sample in body["samples"]]
        except (ValueError, KeyError, TypeError) as error:
            self._answer(400, {"error": f"not a batch of samples: {error}"})
            return
        self._answer(200, {"scores": scores})

    def _answer(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:  # one line per request, on stderr
        sys.stderr.write(f"reward server: {format % args}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: any free port (the first line says which)")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), RewardHandler)
    print(f"reward server listening on http://{args.host}:{server.server_address[1]}/score", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
