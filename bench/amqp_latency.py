"""Upload-to-sidecar latency through Ceph RGW → RabbitMQ → ocrwatch, beside RGW's webhook, and two
daemons on one queue against one.

Starts the suite's servers on 127.0.0.1 (``tests/s3servers.RgwServer``,
``tests/rabbitmq.RabbitServer``; install them with ``tests/install_s3_servers.sh`` and
``tests/install_rabbitmq.sh``).

- **Latency**: one daemon with two ``[[s3]]`` sources, ``transport = "amqp"`` on one bucket and
  ``"webhook"`` on another (both RGW topics synchronous: ``amqp-ack-level=broker``, not persistent).
  ``--uploads`` one-page PNGs go to each, alternately, one at a time; the clock runs from the PUT to
  the moment the JSON sidecar (written last) can be read. Median and max per transport.
- **Scale-out**: ``--documents`` one-page PNGs uploaded at once to an AMQP bucket, consumed by one
  daemon, then (a fresh bucket and queue) by two; first PUT to last sidecar, and how many documents
  each daemon did (each must be done exactly once). On one machine the daemons share its cores, so
  the ratio says more about the split than about speed.

    python bench/amqp_latency.py [--uploads 50] [--documents 50]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import Daemon, emit, free_port, machine, median, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import docs
from tests.support.rabbitmq import RabbitServer
from tests.support.s3servers import RgwServer

EXCHANGE = "ocrwatch.bench"  # one for every bucket: RGW keeps one exchange per push endpoint


def amqp_bucket(rgw: RgwServer, mq: RabbitServer, bucket: str) -> str:
    """``bucket`` publishing to ``EXCHANGE`` with its topic's name as routing key, returned."""
    s3 = rgw.client("s3")
    s3.create_bucket(Bucket=bucket)
    attributes = {
        "push-endpoint": mq.push_endpoint,
        "amqp-exchange": EXCHANGE,
        "amqp-ack-level": "broker",
        "persistent": "false",
    }
    topic = rgw.client("sns").create_topic(Name=f"{bucket}-amqp", Attributes=attributes)["TopicArn"]
    s3.put_bucket_notification_configuration(
        Bucket=bucket,
        NotificationConfiguration={
            "TopicConfigurations": [
                {"Id": "ocrwatch", "TopicArn": topic, "Events": ["s3:ObjectCreated:*"]}
            ]
        },
    )
    return f"{bucket}-amqp"


def amqp_source(rgw: RgwServer, url_file: Path, bucket: str, **keys: Any) -> dict[str, Any]:
    return rgw.s3_config(
        transport="amqp",
        url_file=str(url_file),
        queue=bucket,
        exchange=EXCHANGE,
        routing_key=f"{bucket}-amqp",
        bucket=bucket,
        **keys,
    )


def readable(s3: Any, bucket: str, key: str) -> bool:
    try:
        s3.head_object(Bucket=bucket, Key=key)
    except s3.exceptions.ClientError:
        return False
    return True


def upload_and_wait(s3: Any, bucket: str, key: str, body: bytes) -> float:
    started = time.monotonic()
    s3.put_object(Bucket=bucket, Key=key, Body=body)
    wait_for(lambda: readable(s3, bucket, f"{key}.json"), 300, f"sidecar of {key}", interval=0.01)
    return time.monotonic() - started


def latency(
    rgw: RgwServer, mq: RabbitServer, url_file: Path, scratch: Path, uploads: int
) -> dict[str, Any]:
    amqp_bucket(rgw, mq, "lat-amqp")
    port = free_port()
    webhook = rgw.s3_config(
        transport="webhook", listen=f"127.0.0.1:{port}", token="bench-token", bucket="lat-hook"
    )
    s3 = rgw.client("s3")
    pages = [
        docs.write_png(
            scratch / f"lat-{n}.png", [f"Latency page {n}", "Quarterly report"]
        ).read_bytes()
        for n in range(uploads)
    ]
    with Daemon(scratch / "latency", s3=[amqp_source(rgw, url_file, "lat-amqp"), webhook]):
        s3.create_bucket(Bucket="lat-hook")
        attributes = {
            "push-endpoint": f"http://127.0.0.1:{port}/s3/events?token=bench-token",
            "persistent": "false",
        }
        topic = rgw.client("sns").create_topic(Name="lat-hook-web", Attributes=attributes)[
            "TopicArn"
        ]
        s3.put_bucket_notification_configuration(
            Bucket="lat-hook",
            NotificationConfiguration={
                "TopicConfigurations": [
                    {"Id": "o", "TopicArn": topic, "Events": ["s3:ObjectCreated:*"]}
                ]
            },
        )
        for bucket in ("lat-amqp", "lat-hook"):  # RGW's first write to a bucket takes seconds
            upload_and_wait(s3, bucket, "warm-up.png", pages[0])
        seconds: dict[str, list[float]] = {"amqp": [], "webhook": []}
        for n, body in enumerate(pages):
            seconds["amqp"].append(upload_and_wait(s3, "lat-amqp", f"doc {n}.png", body))
            seconds["webhook"].append(upload_and_wait(s3, "lat-hook", f"doc {n}.png", body))
    return {
        name: {
            "median_s": round(median(values), 3),
            "max_s": round(max(values), 3),
            "n": len(values),
        }
        for name, values in seconds.items()
    }


def scale_out(
    rgw: RgwServer, mq: RabbitServer, url_file: Path, scratch: Path, documents: int, daemons: int
) -> dict[str, Any]:
    bucket = f"scale-{daemons}"
    amqp_bucket(rgw, mq, bucket)
    s3 = rgw.client("s3")
    pages = [
        docs.write_png(scratch / f"s-{n}.png", [f"Document {n}", "Quarterly report"]).read_bytes()
        for n in range(documents)
    ]
    keys = [f"batch/doc {n}.png" for n in range(documents)]
    running = [
        Daemon(scratch / f"{bucket}-{n}", s3=[amqp_source(rgw, url_file, bucket)]).start()
        for n in range(daemons)
    ]
    try:
        time.sleep(1.0)  # every consumer subscribed before the first message
        started = time.monotonic()
        for key, body in zip(keys, pages, strict=True):
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        for key in keys:
            wait_for(lambda key=key: readable(s3, bucket, f"{key}.json"), 900, f"sidecar of {key}")
        seconds = time.monotonic() - started
        time.sleep(1.0)  # job_done is logged just after the sidecars
        done = [
            Counter(
                json.loads(line).get("uri")
                for line in d.log_path.read_text().splitlines()
                if '"job_done"' in line
            )
            for d in running
        ]
    finally:
        for daemon in running:
            daemon.stop()
    total = sum(done, Counter())
    return {
        "seconds": round(seconds, 2),
        "per_daemon": [sum(c.values()) for c in done],
        "each_once": total == Counter({f"s3://{bucket}/{key}": 1 for key in keys}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--uploads", type=int, default=50)
    parser.add_argument("--documents", type=int, default=50)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ocrwatch-bench-amqp-"))
    mq, rgw = RabbitServer().start(), RgwServer().start()
    try:
        url_file = scratch / "amqp-url"
        url_file.write_text(mq.url + "\n")
        url_file.chmod(0o600)
        figures: dict[str, Any] = {"latency": latency(rgw, mq, url_file, scratch, args.uploads)}
        one = scale_out(rgw, mq, url_file, scratch, args.documents, 1)
        two = scale_out(rgw, mq, url_file, scratch, args.documents, 2)
        figures["scale_out"] = {
            "one": one,
            "two": two,
            "speed-up": round(one["seconds"] / two["seconds"], 2),
        }
    finally:
        rgw.stop()
        mq.stop()
    emit({"bench": "amqp_latency", "machine": machine(), **figures})


if __name__ == "__main__":
    main()
