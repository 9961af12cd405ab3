#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "chatsite.settings")
    from chatsite.service_checks import exit_if_unreachable

    # Fail with one clear line, not a traceback, when a configured service is down.
    if len(sys.argv) > 1 and sys.argv[1] in {"runserver", "migrate", "createsuperuser", "create_api_key"}:
        exit_if_unreachable()
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
