"""A small payments service in Python (Flask), for idem proxy's quick start and tests.

It is not idempotent by itself: each POST /payments inserts a charge and answers it.
Every execution is counted in a SQLite database, so a test can tell how many times each
logical request really ran.

    pip install flask
    python3 app.py --port 8000 --db /tmp/payments.db

Endpoints:
    POST /payments           {"amount": 500, "currency": "EUR"} -> 201 {"charge": "ch_1", ...}
    GET  /payments/executions -> {"executions": N, "by_key": {"<Idempotency-Key>": n, ...}}
    GET  /health              -> 200
"""

import argparse
import json
import sqlite3
import threading
import time

from flask import Flask, jsonify, request

app = Flask(__name__)
lock = threading.Lock()
DB = None
DELAY = 0.0


def connect():
    conn = sqlite3.connect(DB, timeout=30)
    conn.execute(
        "CREATE TABLE IF NOT EXISTS executions ("
        " id INTEGER PRIMARY KEY AUTOINCREMENT, idem_key TEXT, body TEXT, at REAL)"
    )
    return conn


@app.post("/payments")
def create_payment():
    body = request.get_json(silent=True) or {}
    key = request.headers.get("Idempotency-Key", "")
    if DELAY:
        time.sleep(DELAY)
    with lock:
        conn = connect()
        with conn:
            cur = conn.execute(
                "INSERT INTO executions (idem_key, body, at) VALUES (?, ?, ?)",
                (key, json.dumps(body, sort_keys=True), time.time()),
            )
            charge = cur.lastrowid
        conn.close()
    return (
        jsonify(
            {
                "charge": f"ch_{charge}",
                "amount": body.get("amount"),
                "currency": body.get("currency"),
            }
        ),
        201,
    )


@app.get("/payments/executions")
def executions():
    with lock:
        conn = connect()
        rows = conn.execute(
            "SELECT idem_key, COUNT(*) FROM executions GROUP BY idem_key"
        ).fetchall()
        conn.close()
    return jsonify(
        {"executions": sum(n for _, n in rows), "by_key": {k: n for k, n in rows}}
    )


@app.get("/health")
def health():
    return "ok\n"


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--db", default="payments.db")
    parser.add_argument(
        "--delay", type=float, default=0.0, help="seconds each payment takes"
    )
    args = parser.parse_args()
    DB = args.db
    DELAY = args.delay
    connect().close()
    app.run(host="127.0.0.1", port=args.port, threaded=True)
