"""A user's script with mistakes that ``mypy --strict`` must report (tests/test_typing.py).

Each line ending in ``# error: TEXT`` must get a mypy error on that line whose message holds
TEXT, and no other line may get one: the test reads mypy's own output. Nothing here is run.
"""

from __future__ import annotations

from boundedproc import Job, run, run_async, run_many


def misspelt() -> None:
    run(["true"], timout=1)  # error: Unexpected keyword argument "timout"
    list(run_many([["true"]], max_ouput=10))  # error: Unexpected keyword argument "max_ouput"
    Job(["true"], cwdd="/")  # error: Unexpected keyword argument "cwdd"


async def misspelt_async() -> None:
    await run_async(["true"], merge_stdrr=True)  # error: Unexpected keyword argument "merge_stdrr"


def wrong_types() -> None:
    run(["true"]).stdout.encode()  # error: "bytes" has no attribute "encode"
    text: bytes = run(["true"], text=True).stdout  # error: expression has type "str"
    run(["true"], keep="middle")  # error: No overload variant of "run" matches
    print(text)
