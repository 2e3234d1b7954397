"""Who may do what: the `auth:` config, identities, roles, and the check every mutation makes.

Pure: no Streamlit here (app/auth.py reads the signed-in user or the proxy's headers and
builds an Identity; the CLI is the local operator of the machine, see `local_identity`).

Roles are ordered: viewer < operator < admin. A mutation names the role it needs and calls
`require` where it happens (app/data.py, before it writes), never only by hiding a button.
"""

from __future__ import annotations

import getpass
import ipaddress
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from kneepoint.durations import parse_duration
from kneepoint.secrets import Secret

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
LOOPBACK_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Refused(PermissionError):
    """A signed-in person lacks the role an action needs; the message says which and why."""


class OidcAuth(Strict):
    """OpenID Connect through Streamlit's st.login (Authlib). The client secret and the
    cookie secret come from the environment (`${VAR}` in kneepoint.yaml)."""

    issuer: Annotated[str, Field(pattern=r"^https?://\S+$")]
    client_id: Annotated[str, Field(min_length=1)]
    client_secret: Secret
    # Where the provider sends the browser back: this app's public URL + /oauth2callback.
    redirect_uri: Annotated[str, Field(pattern=r"^https?://\S+/oauth2callback$")]
    # Signs Streamlit's identity cookie; random per start when unset (everyone signs in
    # again after a restart, and several app instances need one shared value).
    cookie_secret: Secret | None = None
    groups_claim: str = "groups"
    scopes: list[str] = ["openid", "email", "profile"]
    # The OIDC `prompt` st.login sends (Streamlit's default asks to select an account;
    # Keycloak wants "login" or none at all). Unset: Streamlit's default.
    prompt: Literal["none", "login", "consent", "select_account"] | None = None
    # Streamlit's identity cookie lasts 30 days and carries the groups of its sign-in:
    # kneepoint asks for a new sign-in after this long, so a removal at the provider (or a
    # group change) takes effect within it.
    max_session: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 12 * 3600.0
    # An e-mail the provider does not say it verified (`email_verified` missing or false)
    # gets no role, since role lists and allowed domains trust the address. Entra ID sends
    # no such claim; set this only for a provider whose e-mail cannot be chosen by its user.
    trust_unverified_email: bool = False

    @property
    def metadata_url(self) -> str:
        return self.issuer.rstrip("/") + "/.well-known/openid-configuration"


class ProxyAuth(Strict):
    """Identity from a trusted reverse proxy's headers (oauth2-proxy, Pomerium, Cloudflare
    Access): believed only on connections whose peer address is in `trusted`."""

    trusted: Annotated[list[str], Field(min_length=1)]
    email_header: str = "X-Forwarded-Email"
    groups_header: str | None = "X-Forwarded-Groups"
    groups_separator: str = ","

    @field_validator("trusted")
    @classmethod
    def _networks(cls, trusted: list[str]) -> list[str]:
        for entry in trusted:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an address or network like 10.0.0.0/8"
                ) from None
        return trusted

    def trusts(self, address: str | None) -> bool:
        """Whether a connection from `address` comes from the proxy. Streamlit reports the
        peers 127.0.0.1 and ::1 alike (as no address; app/auth.py passes "127.0.0.1"), so
        either one trusted stands for both."""
        if address is None:
            return False
        if address in ("127.0.0.1", "::1"):
            return any(self._contains(peer) for peer in ("127.0.0.1", "::1"))
        return self._contains(address)

    def _contains(self, address: str) -> bool:
        try:
            peer = ipaddress.ip_address(address.strip("[]"))
        except ValueError:
            return False
        if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped:
            peer = peer.ipv4_mapped  # an IPv4 peer of a server listening on ::
        return any(peer in ipaddress.ip_network(entry, strict=False) for entry in self.trusted)


class ApiToken(Strict):
    """A bearer token for kneepoint's HTTP API (the annotation endpoint a CI pipeline posts
    deploys to: kneepoint/annotations.py), with the role it acts with. Give the token as
    `${VAR}`: it is compared in constant time and never logged, shown or stored; the audit
    trail names the token by `name`."""

    name: Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_.:-]+$")]
    token: Secret
    role: Role = "operator"

    @field_validator("token")
    @classmethod
    def _long_enough(cls, token: Secret) -> Secret:
        if len(token.reveal()) < 16:
            raise ValueError("an API token needs at least 16 characters (openssl rand -hex 32)")
        return token


class Auth(Strict):
    """`auth:` in kneepoint.yaml. Role entries are e-mail addresses or `group:NAME`."""

    mode: Literal["none", "oidc", "proxy"]
    oidc: OidcAuth | None = None
    proxy: ProxyAuth | None = None
    # Who may sign in at all (empty: anyone the provider or proxy vouches for; with mode oidc
    # only when `allow_any_account` says so, see `_mode_settings`).
    allowed_domains: list[str] = []
    allowed_emails: list[str] = []
    # mode oidc with no allow list: every account of the provider (any Google account, any
    # tenant's) would get `default_role`. Refused unless this says it is meant.
    allow_any_account: bool = False
    admins: list[str] = []
    operators: list[str] = []
    viewers: list[str] = []
    # The role of a signed-in, allowed person named in no list (None: refused).
    default_role: Role | None = "viewer"
    # mode none: the role of every visitor (no sign-in, so no names).
    anonymous_role: Role = "viewer"
    # Host names the app is reached by (Streamlit's server.allowedHosts: a WebSocket with
    # another Host header is refused, which stops DNS rebinding). Empty: any host. Without
    # `auth:` kneepoint allows only localhost, 127.0.0.1 and ::1.
    hosts: list[str] = []
    # Bearer tokens of the HTTP API (kneepoint/annotations.py), each with its role.
    api_tokens: list[ApiToken] = []

    @model_validator(mode="after")
    def _mode_settings(self) -> Auth:
        if self.mode == "oidc" and self.oidc is None:
            raise ValueError("mode oidc needs an `oidc:` section (issuer, client_id, ...)")
        if self.mode == "proxy" and self.proxy is None:
            raise ValueError("mode proxy needs a `proxy:` section (trusted addresses)")
        if (
            self.mode == "oidc"
            and not (self.allowed_domains or self.allowed_emails)
            and self.default_role is not None
            and not self.allow_any_account
        ):
            raise ValueError(
                "mode oidc with neither allowed_domains nor allowed_emails would let every "
                f"account of the provider sign in as {_article(self.default_role)}; list "
                "allowed_domains or allowed_emails, or set allow_any_account: true if that is "
                "what you want"
            )
        names = [token.name for token in self.api_tokens]
        if len(set(names)) != len(names):
            raise ValueError("api_tokens: each token needs a name of its own")
        return self


def _article(role: Role) -> str:
    return f"an {role}" if role in ("operator", "admin") else f"a {role}"


class Limits(Strict):
    """`limits:` in kneepoint.yaml: what one person can do through the app."""

    silence_max: Annotated[float, Field(gt=0), BeforeValidator(parse_duration)] = 24 * 3600.0
    upload_mb: Annotated[float, Field(gt=0, le=1024)] = 20.0


@dataclass(frozen=True)
class Identity:
    """Who is acting. `email` is None for an anonymous visitor (auth mode none)."""

    name: str
    role: Role | None
    via: Literal["local", "none", "oidc", "proxy", "cli", "api"]
    email: str | None = None
    groups: tuple[str, ...] = ()
    address: str | None = None
    why_not: str = ""  # role None: why this person has no access

    def can(self, needed: Role) -> bool:
        return self.role is not None and ROLES.index(self.role) >= ROLES.index(needed)


def require(who: Identity, needed: Role, action: str) -> None:
    """Raise Refused, saying why, unless `who` holds `needed` (or a higher role)."""
    if who.can(needed):
        return
    has = f"the {who.role} role" if who.role else "no role"
    raise Refused(f"{action} needs the {needed} role; {who.name} has {has}.")


def role_for(auth: Auth, email: str, groups: tuple[str, ...]) -> tuple[Role | None, str]:
    """The role of a signed-in person, and why they have none when None. E-mails compare
    without case; groups exactly; a role entry is an e-mail or `group:NAME`."""
    email = email.strip().lower()
    if email.count("@") != 1 or email.startswith("@") or email.endswith("@"):
        return None, f"{email!r} is not an e-mail address"
    domain = email.rpartition("@")[2]
    allowed_emails = {e.lower() for e in auth.allowed_emails}
    allowed_domains = {d.lower().lstrip("@") for d in auth.allowed_domains}
    if (allowed_emails or allowed_domains) and not (
        email in allowed_emails or domain in allowed_domains
    ):
        return None, f"{email} is not in auth.allowed_emails or auth.allowed_domains"
    ranked: tuple[tuple[Role, list[str]], ...] = (
        ("admin", auth.admins),
        ("operator", auth.operators),
        ("viewer", auth.viewers),
    )
    for role, members in ranked:
        emails = {m.lower() for m in members if not m.startswith("group:")}
        named_groups = {m.removeprefix("group:") for m in members if m.startswith("group:")}
        if email in emails or named_groups & set(groups):
            return role, ""
    if auth.default_role is None:
        return None, f"{email} is named in no role list and auth.default_role is unset"
    return auth.default_role, ""


def signed_in(
    auth: Auth,
    email: str | None,
    groups: tuple[str, ...],
    via: Literal["oidc", "proxy"],
    address: str | None,
) -> Identity:
    email = (email or "").strip().lower()
    if not email:
        return Identity("unknown", None, via, None, groups, address, "no e-mail was given")
    role, why = role_for(auth, email, groups)
    return Identity(email, role, via, email, groups, address, why)


def anonymous(auth: Auth | None, address: str | None) -> Identity:
    """Without sign-in: on loopback with no `auth:`, the machine's own user (admin, as with a
    shell on the machine that can edit the database anyway); with `auth: {mode: none}` every
    visitor gets `anonymous_role`."""
    if auth is None:
        return Identity("local user", "admin", "local", None, (), address)
    return Identity("anonymous", auth.anonymous_role, "none", None, (), address)


def local_identity() -> Identity:
    """The command line's actor: whoever runs kneepoint on the machine (admin)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return Identity(f"cli:{user}", "admin", "cli")


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listen_problem(host: str, auth: Auth | None) -> str | None:
    """Why kneepoint refuses to listen on `host` (None: it may)."""
    if is_loopback(host) or auth is not None:
        return None
    return (
        f"refusing to listen on {host} without sign-in: set `auth:` in kneepoint.yaml "
        "(mode oidc or proxy, or `auth: {mode: none}` to allow everyone on the network)"
    )
