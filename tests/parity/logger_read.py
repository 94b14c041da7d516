"""Reads back what loom's loggers wrote (tests/unit/toolbox/logger_test.cpp, [logger][python]).

  python logger_read.py TRUTH_FILE

TRUTH_FILE lists every logged value as "TAG STEP VALUE KIND" (VALUE an exact hex float, or an
int), then "csv PATH" and, where loom was built with TensorBoard, "tensorboard LOG_DIR".
Python's csv module must read every value of metrics.csv exactly (a float's text parses to
the same double, an int's to the same int, each in its own row with its step), and
TensorBoard's event_accumulator every scalar exactly as the f32 TensorBoard stores.
"""

import csv
import struct
import sys
from collections import defaultdict


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main(truth_path):
    values, files = [], {}
    with open(truth_path) as f:
        for line in f:
            w = line.split()
            if w[0] in ("csv", "tensorboard"):
                files[w[0]] = w[1]
                continue
            tag, step, value, kind = w
            values.append((tag, int(step), float.fromhex(value) if kind == "float" else int(value),
                           kind))

    # csv: every value in a row of its step, of its kind.
    with open(files["csv"], newline="") as f:
        rows = list(csv.DictReader(f))
    by_step = defaultdict(list)
    for r in rows:
        by_step[int(r["step"])].append(r)
    for tag, step, value, kind in values:
        texts = [r[tag] for r in by_step[step] if r.get(tag, "") != ""]
        if len(texts) != 1:
            raise AssertionError(f"csv: {tag} at step {step}: {len(texts)} values")
        got = float(texts[0]) if kind == "float" else int(texts[0])
        if got != value or type(got) is not type(value):
            raise AssertionError(f"csv: {tag} at step {step}: {texts[0]!r} vs {value!r}")
    print(f"csv: {len(values)} values in {len(rows)} rows read back exactly")

    if "tensorboard" in files:
        from tensorboard.backend.event_processing import event_accumulator
        acc = event_accumulator.EventAccumulator(files["tensorboard"],
                                                 size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        tags = acc.Tags()["scalars"]
        want = defaultdict(dict)
        for tag, step, value, kind in values:
            want[tag][step] = f32(float(value))
        if sorted(tags) != sorted(want):
            raise AssertionError(f"tensorboard: tags {sorted(tags)} vs {sorted(want)}")
        n = 0
        for tag in tags:
            events = acc.Scalars(tag)
            got = {e.step: e.value for e in events}
            if got != want[tag] or len(events) != len(want[tag]):
                raise AssertionError(f"tensorboard: {tag}: {got} vs {want[tag]}")
            if any(e.wall_time <= 0 for e in events):
                raise AssertionError(f"tensorboard: {tag}: an event without a wall time")
            n += len(events)
        print(f"tensorboard: {n} scalars of {len(tags)} tags read back exactly")


if __name__ == "__main__":
    main(sys.argv[1])
