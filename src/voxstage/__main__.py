"""``python -m voxstage ...`` runs the same CLI as the ``voxstage`` console script."""

from voxstage.launch.cli import main
from voxstage.lifetime import die_with_launcher, exit_process

if __name__ == "__main__":
    die_with_launcher()  # a stage of ``voxstage serve``: stop with the launcher (voxstage.lifetime)
    exit_process(main())
