from train.cli import build_parser


def test_serve_subcommand_options_are_not_read_as_abbreviations():
    """`--triton` must reach `serve gateway`, not be taken for the parent's --triton-*-port options."""
    args = build_parser().parse_args(["serve", "gateway", "--triton", "10.0.0.2:8001", "--port", "9000"])
    assert args.triton == "10.0.0.2:8001" and args.port == 9000
