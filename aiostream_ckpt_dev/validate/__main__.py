import sys

from aiostream_ckpt_dev.validate.cli import validate_main

if __name__ == "__main__":
    sys.exit(validate_main(sys.argv[1:]))
