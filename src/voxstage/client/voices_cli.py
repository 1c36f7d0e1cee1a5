"""``voxstage voices add|list|rm``: the gateway's voice library from the command line, through the SDK.

    voxstage voices add narrator sample.wav --ref-text "What the sample says."
    voxstage voices list
    voxstage voices rm narrator
"""

from __future__ import annotations

import argparse
import sys

from voxstage.client._common import Voice, add_connection_options, connection_options

EXIT_FAILED = 1


def _show(v: Voice) -> str:
    if not v.uploaded:
        return f"{v.name}\tbuilt-in\t{v.model}\t{','.join(v.languages)}\t{v.description}"
    consent = "\tconsent" if v.consent else ""
    return f"{v.name}\t{v.id}\t{v.model}\t{v.sample_seconds:.1f} s\t{v.ref_text!r}{consent}"


def _run(args: argparse.Namespace) -> int:
    from voxstage.client import SpeechClient, SpeechError

    try:
        with SpeechClient(args.addr, timeout=args.timeout, **connection_options(args)) as client:
            if args.action == "add":
                voice = client.create_voice(
                    args.name, args.audio, ref_text=args.ref_text, model=args.model, language=args.language,
                    description=args.description, consent_audio=args.consent,
                )  # fmt: skip
                print(_show(voice))
            elif args.action == "list":
                for voice in client.list_voices(model=args.model):
                    if voice.uploaded or not args.uploaded:
                        print(_show(voice))
            else:
                print(f"deleted {client.delete_voice(args.voice)}")
    except (SpeechError, OSError) as exc:
        print(f"voxstage voices {args.action}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return 0


def add_voices(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "voices", help="the gateway's voice library: add, list, rm", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    actions = parser.add_subparsers(dest="action", required=True, help="add, list or rm")
    add = actions.add_parser("add", help="upload a voice: a sample recording and its transcript")
    add.add_argument("name", help="the voice's name (letters, digits, _ - . and inner spaces)")
    add.add_argument("audio", help="the sample: an audio file (WAV, FLAC, OGG, MP3)")
    add.add_argument("--ref-text", default="", help="transcript of the sample (required by most models)")
    add.add_argument("--language", default="", help="language of the sample, stored and listed")
    add.add_argument("--description", default="")
    add.add_argument("--consent", default=None, metavar="FILE", help="a recording of the speaker's consent")
    lst = actions.add_parser("list", help="built-in and uploaded voices")
    lst.add_argument("--uploaded", action="store_true", help="uploaded voices only")
    rm = actions.add_parser("rm", help="delete an uploaded voice")
    rm.add_argument("voice", help="its id or name")
    for sub in (add, lst, rm):
        sub.add_argument("--addr", default="localhost:50051", help="gateway gRPC address (host:port)")
        sub.add_argument("--timeout", type=float, default=120.0, help="deadline in seconds")
        add_connection_options(sub)
    for sub in (add, lst):
        sub.add_argument("--model", default="", help="served model name; default: the deployment's")
    rm.set_defaults(model="")
    parser.set_defaults(handler=_run)
