"""Hand-built event logs for tests, from a compact table: one event a line,
``kind uid [step [time_s]] [field=value ...]`` (``uid`` may list rows, ``0,1``: the same
event for each, as batched rows step together), ``#`` to the end of a line a comment."""

from workbench.observe.events import Event


def _value(text: str) -> int | float | str:
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text


def event_log(table: str) -> list[Event]:
    """The :class:`~workbench.observe.events.Event` of each line of ``table`` (blank lines and
    ``#`` comments skipped):
    kind, uid (or comma-separated uids: one event each, in that order), then step (default 0)
    and time in seconds (default 0.0), then any other Event field as ``field=value`` (ints
    and floats parsed, anything else a string).

    >>> event_log("submit 0 0 0.5 n_tokens=4\\nfinish 0 2 3.0 finish_reason=length")[1].finish_reason
    'length'
    >>> [e.uid for e in event_log("token 0,1 3 2.5 token=7")]
    [0, 1]
    """
    events = []
    for line in table.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        positional = [w for w in words[2:] if "=" not in w]
        fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
        step, time_s = (positional + ["0", "0.0"][len(positional) :])[:2]
        extra = {name: _value(value) for name, value in fields.items()}
        events += [
            Event(words[0], int(uid), int(step), float(time_s), **extra) for uid in words[1].split(",")
        ]
    return events
