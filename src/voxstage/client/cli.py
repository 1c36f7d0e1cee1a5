"""``voxstage say "text" -o out.wav``: synthesize through a running gateway with the SDK.

The output format follows the file name's extension, or ``--format``; both come from the one format table
(``voxstage.formats``: .wav, .pcm/.raw, .f32, .ulaw, .alaw, .mp3, .opus/.ogg, .flac). ``--stream`` uses the
streaming RPC and writes audio as it arrives, reporting the time to the first chunk.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING, Any

from voxstage import formats
from voxstage.client._common import add_connection_options, connection_options

if TYPE_CHECKING:
    from voxstage.client import SpeechClient

EXIT_FAILED = 1
EXIT_INVALID = 2
SUFFIXES = {suffix: f.name for suffix, f in formats.BY_SUFFIX.items()}


def _encoding(path: str) -> str | None:
    found = formats.by_suffix(path)
    return None if found is None else found.name


def _run(args: argparse.Namespace) -> int:
    from voxstage.client import SpeechClient, SpeechError

    encoding = args.format or _encoding(args.output)
    if encoding is None:
        print(
            f"voxstage say: -o: cannot tell the format of {args.output!r}; use one of {', '.join(SUFFIXES)} "
            "or give --format",
            file=sys.stderr,
        )
        return EXIT_INVALID
    if args.stream and not formats.BY_NAME[encoding].streams:
        print(
            f"voxstage say: --stream: {encoding} is produced whole; drop --stream or use one of "
            f"{', '.join(formats.STREAMING_NAMES)}",
            file=sys.stderr,
        )
        return EXIT_INVALID
    options = {
        "voice": args.voice,
        "model": args.model,
        "language": args.language,
        "instructions": args.instructions,
        "sample_rate": args.sample_rate,
        "seed": args.seed,
        "max_frames": args.max_frames,
    }
    start = time.monotonic()
    try:
        with SpeechClient(args.addr, timeout=args.timeout, **connection_options(args)) as client:
            if args.stream:
                return _stream_to_file(client, args, encoding, options, start)
            audio = client.synthesize(args.text, encoding=encoding, **options)
    except SpeechError as exc:
        print(f"voxstage say: {exc}", file=sys.stderr)
        return EXIT_FAILED
    audio.save(args.output)
    seconds = (
        f"{audio.duration_s:.2f} s of audio" if encoding in ("wav", "pcm") else f"{len(audio.data)} bytes"
    )
    print(
        f"{args.output}: {seconds} at {audio.sample_rate} Hz in {time.monotonic() - start:.2f} s",
        file=sys.stderr,
    )
    return 0


def _stream_to_file(
    client: SpeechClient, args: argparse.Namespace, encoding: str, options: dict[str, Any], start: float
) -> int:
    """Write each chunk as it arrives; a streamed WAV's open-ended header gets its real sizes at the end."""
    session = client.session(encoding=encoding, **options)
    session.push_text(args.text)
    session.end_input()
    ttfa: float | None = None
    size = 0
    with open(args.output, "wb") as out:
        for chunk in session:
            ttfa = time.monotonic() - start if ttfa is None else ttfa
            out.write(chunk.data)
            out.flush()
            size += len(chunk.data)
        if encoding == "wav" and size >= 44:
            out.seek(4)
            out.write((size - 8).to_bytes(4, "little"))
            out.seek(40)
            out.write((size - 44).to_bytes(4, "little"))
    rate = session.info.sample_rate if session.info is not None else 0
    print(
        f"{args.output}: {size} bytes at {rate} Hz in {time.monotonic() - start:.2f} s, first audio after "
        f"{(ttfa or 0) * 1000:.0f} ms",
        file=sys.stderr,
    )
    return 0


def add_say(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "say", help="synthesize text through a running gateway", description=__doc__
    )
    parser.add_argument("text", help="what to say")
    parser.add_argument(
        "-o", "--output", required=True, help=f"output file ({', '.join(SUFFIXES)}; any name with --format)"
    )
    parser.add_argument(
        "--format", choices=formats.NAMES, default=None, help="output format (default: from the file name)"
    )
    parser.add_argument("--addr", default="localhost:50051", help="gateway gRPC address (host:port)")
    add_connection_options(parser)
    parser.add_argument("--voice", default="", help="voice name (see ListVoices); default: the model's")
    parser.add_argument("--model", default="", help="served model name; default: the deployment's")
    parser.add_argument("--language", default="", help="language name or BCP-47 tag; default: auto")
    parser.add_argument("--instructions", default="", help="style instructions (models that take them)")
    parser.add_argument("--sample-rate", type=int, default=None, help="output rate in Hz (resampled)")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed, for reproducible audio")
    parser.add_argument(
        "--max-frames",
        type=int,
        default=None,
        help="cap on generated codec frames (12.5 per second of audio)",
    )
    parser.add_argument("--stream", action="store_true", help="stream: write audio as it arrives")
    parser.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
    parser.set_defaults(handler=_run)
