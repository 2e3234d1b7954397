"""kneepoint/auth.py: the `auth:` config, who gets which role, the proxy's trusted addresses,
and where kneepoint agrees to listen."""

from __future__ import annotations

from pathlib import Path

import pytest

from kneepoint.auth import (
    Auth,
    Identity,
    ProxyAuth,
    Refused,
    anonymous,
    listen_problem,
    local_identity,
    require,
    role_for,
    signed_in,
)
from kneepoint.config import ConfigError, load_config

MAPPED = Auth(
    mode="proxy",
    proxy=ProxyAuth(trusted=["10.0.0.0/8"]),
    admins=["Root@Example.com", "group:sre-leads"],
    operators=["group:oncall", "ops@example.com"],
    viewers=["group:everyone"],
)


def config_with(tmp_path: Path, auth: str) -> Path:
    path = tmp_path / "kneepoint.yaml"
    path.write_text(f"database: sqlite:///{tmp_path / 'k.db'}\ntargets: []\nauth: {auth}\n")
    return path


# --- Roles --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("email", "groups", "role"),
    [
        ("root@example.com", (), "admin"),
        ("ROOT@EXAMPLE.COM", (), "admin"),  # e-mails compare without case, both ways
        ("  Ops@Example.COM ", (), "operator"),
        ("someone@example.com", ("oncall",), "operator"),
        ("someone@example.com", ("everyone", "sre-leads"), "admin"),  # the highest role wins
        ("ops@example.com", ("sre-leads",), "admin"),
        ("someone@example.com", ("everyone",), "viewer"),
        ("someone@example.com", (), "viewer"),  # default_role
    ],
)
def test_roles_come_from_emails_and_groups(email: str, groups: tuple[str, ...], role: str) -> None:
    assert role_for(MAPPED, email, groups) == (role, "")


def test_group_names_are_not_emails() -> None:
    # "group:oncall" names a group; an e-mail that happens to equal the group name is not it,
    # and a group named like an operator's e-mail is not that operator.
    auth = MAPPED.model_copy(update={"default_role": None})
    assert role_for(auth, "oncall", ())[0] is None
    assert role_for(auth, "x@example.com", ("ops@example.com",))[0] is None


def test_no_default_role_refuses_anyone_named_in_no_list() -> None:
    auth = MAPPED.model_copy(update={"default_role": None})
    role, why = role_for(auth, "stranger@example.com", ("visitors",))
    assert role is None
    assert "stranger@example.com" in why and "default_role" in why
    assert role_for(auth, "stranger@example.com", ("oncall",)) == ("operator", "")


def test_allowed_domains_and_emails_gate_sign_in_before_any_role() -> None:
    auth = MAPPED.model_copy(
        update={"allowed_domains": ["@Example.com"], "allowed_emails": ["Guest@Partner.io"]}
    )
    assert role_for(auth, "someone@EXAMPLE.com", ()) == ("viewer", "")
    assert role_for(auth, "guest@partner.io", ()) == ("viewer", "")
    for outsider in ("other@partner.io", "root@example.com.evil.io", "root@sub.example.com"):
        role, why = role_for(auth, outsider, ("sre-leads",))  # an admin group does not help
        assert role is None, outsider
        assert "allowed_emails" in why and "allowed_domains" in why
    # Only an allowed address: everyone else is refused, whatever the lists say.
    only = MAPPED.model_copy(update={"allowed_emails": ["ops@example.com"]})
    assert role_for(only, "OPS@example.com", ()) == ("operator", "")
    assert role_for(only, "root@example.com", ())[0] is None


def test_a_signed_in_identity_is_lowercased_and_one_without_an_email_has_no_role() -> None:
    who = signed_in(MAPPED, "Ops@Example.com", ("x",), "proxy", "10.1.2.3")
    assert (who.name, who.email, who.role, who.via, who.address) == (
        "ops@example.com",
        "ops@example.com",
        "operator",
        "proxy",
        "10.1.2.3",
    )
    nobody = signed_in(MAPPED, None, ("sre-leads",), "oidc", None)
    assert nobody.role is None and nobody.why_not == "no e-mail was given"


def test_require_names_the_role_needed_and_the_one_held() -> None:
    viewer = Identity("anonymous", "viewer", "none")
    with pytest.raises(Refused) as refused:
        require(viewer, "operator", "Creating a silence")
    assert str(refused.value) == (
        "Creating a silence needs the operator role; anonymous has the viewer role."
    )
    with pytest.raises(Refused, match="nobody@x has no role"):
        require(Identity("nobody@x", None, "oidc"), "viewer", "Opening a page")
    operator = Identity("ops@example.com", "operator", "proxy")
    require(operator, "viewer", "Reading")
    require(operator, "operator", "Creating a silence")
    with pytest.raises(Refused, match="needs the admin role"):
        require(operator, "admin", "The Audit page")


def test_without_sign_in_the_local_user_is_admin_and_mode_none_gives_anonymous_role() -> None:
    assert anonymous(None, "127.0.0.1").role == "admin"  # loopback, no auth: the machine's user
    none = Auth(mode="none", anonymous_role="operator")
    visitor = anonymous(none, "192.168.1.9")
    assert (visitor.name, visitor.role, visitor.via) == ("anonymous", "operator", "none")
    assert Auth(mode="none").anonymous_role == "viewer"  # the default is read only
    assert local_identity().name.startswith("cli:") and local_identity().role == "admin"


# --- The proxy's addresses ----------------------------------------------------------------


def test_the_proxy_is_trusted_only_from_its_addresses_and_networks() -> None:
    proxy = ProxyAuth(trusted=["10.0.0.0/8", "192.168.5.7", "fd00::/8", "::1"])
    for address in ("10.0.0.1", "10.255.255.254", "192.168.5.7", "fd00::1", "::1", "[::1]"):
        assert proxy.trusts(address), address
    outside: tuple[str | None, ...] = (
        "11.0.0.1",
        "192.168.5.8",
        "fe80::1",
        "",
        "not-an-address",
        "10.0.0.1, 1.2.3.4",  # an X-Forwarded-For style list is never a peer address
        None,
    )
    for peer in outside:
        assert not proxy.trusts(peer), peer
    assert not ProxyAuth(trusted=["10.0.0.0/8"]).trusts("127.0.0.1")  # loopback: only if listed


def test_a_host_address_with_bits_set_counts_as_its_network() -> None:
    assert ProxyAuth(trusted=["10.1.2.3/16"]).trusts("10.1.200.9")


# --- Config errors, one sentence each -----------------------------------------------------


@pytest.mark.parametrize(
    ("auth", "sentence"),
    [
        ("{mode: oidc}", "auth: mode oidc needs an `oidc:` section (issuer, client_id, ...)"),
        ("{mode: proxy}", "auth: mode proxy needs a `proxy:` section (trusted addresses)"),
        (
            "{mode: proxy, proxy: {trusted: [office]}}",
            "auth.proxy.trusted: 'office' is not an address or network like 10.0.0.0/8",
        ),
        ("{mode: sso}", "auth.mode: Input should be 'none', 'oidc' or 'proxy'"),
        (
            "{mode: none, anonymous_role: root}",
            "auth.anonymous_role: Input should be 'viewer', 'operator' or 'admin'",
        ),
        (
            "{mode: oidc, oidc: {issuer: 'https://idp', client_id: k, client_secret: s, "
            "redirect_uri: 'https://k.example/callback'}}",
            "auth.oidc.redirect_uri:",
        ),
    ],
)
def test_a_bad_auth_section_is_one_sentence_naming_the_key(
    tmp_path: Path, auth: str, sentence: str
) -> None:
    path = config_with(tmp_path, auth)
    with pytest.raises(ConfigError) as error:
        load_config(path)
    message = str(error.value)
    assert message.startswith(f"{path}: {sentence}")
    assert "\n" not in message


OIDC = (
    "mode: oidc, oidc: {issuer: 'https://accounts.google.com', client_id: k, client_secret: s, "
    "redirect_uri: 'https://kp.example.com/oauth2callback'}"
)


@pytest.mark.parametrize("default_role", ["", ", default_role: viewer", ", default_role: admin"])
def test_oidc_without_an_allow_list_is_refused_since_every_account_would_get_in(
    tmp_path: Path, default_role: str
) -> None:
    path = config_with(tmp_path, f"{{{OIDC}{default_role}}}")
    with pytest.raises(ConfigError) as error:
        load_config(path)
    role = "an admin" if "admin" in default_role else "a viewer"
    assert str(error.value) == (
        f"{path}: auth: mode oidc with neither allowed_domains nor allowed_emails would let "
        f"every account of the provider sign in as {role}; list allowed_domains or "
        "allowed_emails, or set allow_any_account: true if that is what you want"
    )


@pytest.mark.parametrize(
    "extra",
    [
        ", allowed_domains: [example.com]",
        ", allowed_emails: [ops@example.com]",
        ", allow_any_account: true",
        ", default_role: null, admins: [ops@example.com]",  # only those named get in
    ],
)
def test_oidc_loads_with_an_allow_list_or_when_any_account_is_meant(
    tmp_path: Path, extra: str
) -> None:
    auth = load_config(config_with(tmp_path, f"{{{OIDC}{extra}}}")).auth
    assert auth is not None and auth.mode == "oidc"
    assert auth.allow_any_account == ("allow_any_account" in extra)
    role, _ = role_for(auth, "someone@gmail.com", ())
    assert role == ("viewer" if "allow_any_account" in extra else None)


def test_the_proxy_mode_needs_no_allow_list(tmp_path: Path) -> None:
    """The proxy decides who reaches the app; kneepoint trusts its identity headers."""
    auth = load_config(config_with(tmp_path, "{mode: proxy, proxy: {trusted: [10.0.0.5]}}")).auth
    assert auth is not None and not auth.allow_any_account


def test_a_good_auth_section_loads(tmp_path: Path) -> None:
    path = config_with(
        tmp_path,
        "{mode: proxy, proxy: {trusted: [10.0.0.5]}, operators: ['group:oncall'], "
        "default_role: null}",
    )
    auth = load_config(path).auth
    assert auth is not None and auth.mode == "proxy" and auth.default_role is None
    assert role_for(auth, "a@b.c", ("oncall",)) == ("operator", "")


# --- Where kneepoint listens --------------------------------------------------------------


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"])
def test_loopback_is_allowed_with_or_without_auth(host: str) -> None:
    assert listen_problem(host, None) is None
    assert listen_problem(host, Auth(mode="none")) is None


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "10.0.0.3", "kneepoint.lan"])
def test_any_other_address_needs_an_auth_section(host: str) -> None:
    problem = listen_problem(host, None)
    assert problem is not None
    assert problem.startswith(f"refusing to listen on {host} without sign-in: set `auth:`")
    assert "auth: {mode: none}" in problem and "\n" not in problem
    for auth in (Auth(mode="none"), MAPPED):
        assert listen_problem(host, auth) is None


def test_the_secrets_file_for_st_login_carries_the_revealed_secrets_and_the_prompt() -> None:
    import tomllib

    from kneepoint.config import parse_config
    from kneepoint.webapp import oidc_secrets

    text = (
        "auth: {mode: oidc, oidc: {issuer: 'https://id.example.com/realms/ops', "
        "client_id: kneepoint, client_secret: s3cr3t-client, cookie_secret: s3cr3t-cookie, "
        "redirect_uri: 'https://kp.example.com/oauth2callback', prompt: login}, "
        "allowed_domains: [example.com]}"
    )
    config = parse_config(text)
    assert "s3cr3t" not in repr(config) and "s3cr3t" not in config.model_dump_json()
    assert config.auth is not None and config.auth.oidc is not None
    table = tomllib.loads(oidc_secrets(config.auth.oidc))["auth"]
    assert table["client_secret"] == "s3cr3t-client"
    assert table["cookie_secret"] == "s3cr3t-cookie"
    assert table["server_metadata_url"] == (
        "https://id.example.com/realms/ops/.well-known/openid-configuration"
    )
    assert table["client_kwargs"] == {"scope": "openid email profile", "prompt": "login"}
    unset = parse_config(
        text.replace(", prompt: login", "").replace("cookie_secret: s3cr3t-cookie, ", "")
    )
    assert unset.auth is not None and unset.auth.oidc is not None
    again = tomllib.loads(oidc_secrets(unset.auth.oidc))["auth"]
    assert "prompt" not in again["client_kwargs"]
    assert len(again["cookie_secret"]) >= 32  # random per start when unset


def test_a_trusted_ipv6_loopback_proxy_is_recognised_though_streamlit_hides_it() -> None:
    # Streamlit reports 127.0.0.1 and ::1 peers alike; app/auth.py passes "127.0.0.1".
    assert ProxyAuth(trusted=["::1/128"]).trusts("127.0.0.1")
    assert ProxyAuth(trusted=["127.0.0.1/32"]).trusts("::1")
    # Another loopback address is reported as itself and is not 127.0.0.1.
    assert not ProxyAuth(trusted=["127.0.0.2/32"]).trusts("127.0.0.1")
    assert ProxyAuth(trusted=["127.0.0.2/32"]).trusts("127.0.0.2")


def test_an_asserted_e_mail_that_looks_like_a_group_entry_gets_no_role() -> None:
    auth = Auth(mode="proxy", proxy=ProxyAuth(trusted=["10.0.0.1"]), admins=["group:sre-leads"])
    assert role_for(auth, "group:sre-leads", ())[0] is None
    assert role_for(auth, "a@b@example.com", ())[0] is None
    assert role_for(auth, "lead@example.com", ("sre-leads",))[0] == "admin"
    # A group named like an admin's e-mail is still only a group.
    named = Auth(mode="proxy", proxy=ProxyAuth(trusted=["10.0.0.1"]), admins=["boss@example.com"])
    assert role_for(named, "x@example.com", ("boss@example.com",))[0] == "viewer"


def test_an_ipv4_peer_of_a_server_on_every_ipv6_address_is_matched_as_ipv4() -> None:
    assert ProxyAuth(trusted=["10.0.0.0/8"]).trusts("::ffff:10.1.2.3")
    assert not ProxyAuth(trusted=["10.0.0.0/8"]).trusts("::ffff:11.1.2.3")


def test_the_allowed_hosts_are_loopback_names_without_auth_and_the_configured_ones_with() -> None:
    from kneepoint.config import parse_config
    from kneepoint.webapp import allowed_hosts

    assert allowed_hosts(parse_config("")) == ["localhost", "127.0.0.1", "::1"]
    assert allowed_hosts(parse_config("auth: {mode: none}")) == []
    hosts = parse_config("auth: {mode: none, hosts: [kneepoint.example.com]}")
    assert allowed_hosts(hosts) == ["kneepoint.example.com"]


def test_an_oidc_sign_in_older_than_max_session_must_be_renewed() -> None:
    from app.auth import session_expired

    assert not session_expired(signed_at=1000.0, now=1000.0 + 12 * 3600, max_session=12 * 3600)
    assert session_expired(signed_at=1000.0, now=1001.0 + 12 * 3600, max_session=12 * 3600)
