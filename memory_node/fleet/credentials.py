"""Where the fleet URL and its password may come from, and how they are kept out of logs.

A password is taken only from the environment (`MEMORY_FLEET_URL`, libpq's `PGPASSWORD`) or a
file only its owner can read (`MEMORY_FLEET_URL_FILE`, libpq's `~/.pgpass`). A URL given on a
command line or as a ROS parameter is visible to every user of the machine (`ps`,
`ros2 param get`), so one that carries a password is refused.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

URL_ENV = "MEMORY_FLEET_URL"
URL_FILE_ENV = "MEMORY_FLEET_URL_FILE"


class CredentialError(ValueError):
    """A fleet URL from a place a password must not come from, or an unsafe file."""


def _password(url: str) -> str | None:
    try:
        return urlsplit(url).password
    except ValueError:
        return None


def _password_in_query(url: str) -> bool:
    return "password=" in url.lower()


def redact(url: str | None) -> str:
    """The URL with any password replaced by ***: what may appear in a log line."""
    if not url:
        return ""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<fleet url>"
    netloc = parts.netloc
    if parts.password is not None:
        user, _, host = netloc.rpartition("@")
        name = user.split(":", 1)[0]
        netloc = f"{name}:***@{host}"
    query = parts.query
    if _password_in_query(url):
        query = "&".join("password=***" if q.lower().startswith("password=") else q
                         for q in query.split("&"))
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def scrub(message: str, url: str | None) -> str:
    """A driver's error message with the URL's password (if it shows up) removed."""
    secret = _password(url or "")
    if secret:
        message = message.replace(secret, "***")
    if url and url in message:
        message = message.replace(url, redact(url))
    return message


def read_url_file(path: str | os.PathLike[str]) -> str:
    """The URL in a file that only its owner may read (like ~/.pgpass: mode 0600)."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
    except OSError as exc:
        raise CredentialError(f"{URL_FILE_ENV}: cannot read {p}: {exc.strerror}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialError(f"{p} is readable by other users (mode {stat.S_IMODE(st.st_mode):o});"
                              f" chmod 600 it")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CredentialError(f"{p} belongs to another user")
    url = p.read_text(encoding="utf-8").strip()
    if not url:
        raise CredentialError(f"{p} is empty")
    return url


def resolve_fleet_url(explicit: str | None = None,
                      env: Mapping[str, str] | None = None) -> str | None:
    """The fleet URL: `explicit` (a command-line option or ROS parameter, no password allowed),
    else $MEMORY_FLEET_URL, else the file named by $MEMORY_FLEET_URL_FILE; None when none is set.

    A password-less URL is completed by libpq from PGPASSWORD or ~/.pgpass (PGPASSFILE)."""
    env = os.environ if env is None else env
    if explicit:
        explicit = explicit.strip()
        if _password(explicit) or _password_in_query(explicit):
            raise CredentialError(
                "the fleet URL given on the command line or as a parameter holds a password, "
                "which every user of this machine can read there; give it in "
                f"${URL_ENV}, ${URL_FILE_ENV} (a file only you can read), $PGPASSWORD or "
                "~/.pgpass instead")
        return explicit
    if env.get(URL_ENV, "").strip():
        return env[URL_ENV].strip()
    if env.get(URL_FILE_ENV, "").strip():
        return read_url_file(env[URL_FILE_ENV].strip())
    return None
