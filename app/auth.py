"""Who is looking at the app: the signed-in user (OIDC through st.login), the identity a
trusted proxy vouches for, or, without sign-in, the local user or an anonymous visitor.

Everything here runs on the server, in the session's script run: the identity comes from
Streamlit's identity cookie (signed with the cookie secret) or from the headers and the peer
address of the session's own WebSocket connection, never from anything the page sends.
"""

from __future__ import annotations

import time
from dataclasses import replace

import streamlit as st

from app import data
from kneepoint import audit
from kneepoint.auth import Identity, Refused, Role, anonymous, require, signed_in

_SIGNED_IN = "kneepoint-signed-in"


def peer_address() -> str | None:
    """The session connection's peer. Streamlit reports a loopback peer (127.0.0.1 or ::1)
    as None, returned here as 127.0.0.1 (ProxyAuth.trusts treats every loopback alike); kneepoint
    starts its server trusting no X-Forwarded-For (FORWARDED_ALLOW_IPS is empty), so this is
    the TCP peer itself, not what a client claims."""
    address = st.context.ip_address
    return address if isinstance(address, str) else "127.0.0.1"


def current() -> Identity:
    """The identity of this browser session, as the server establishes it."""
    config, _ = data.store()
    auth = config.auth
    address = peer_address()
    if auth is None or auth.mode == "none":
        return anonymous(auth, address)
    if auth.mode == "oidc":
        assert auth.oidc is not None
        if not st.user.is_logged_in:
            return Identity("not signed in", None, "oidc", address=address, why_not="sign in")
        groups = _groups(st.user.get(auth.oidc.groups_claim))
        email = st.user.get("email")
        who = signed_in(auth, str(email) if email else None, groups, "oidc", address)
        if st.user.get("email_verified") is False:  # the provider says it did not check
            return replace(who, role=None, why_not=f"the provider has not verified {who.name}")
        return who
    assert auth.proxy is not None
    proxy = auth.proxy
    if not proxy.trusts(address):
        return Identity(
            "unknown",
            None,
            "proxy",
            address=address,
            why_not=f"the connection from {address} did not come through the trusted proxy",
        )
    headers = st.context.headers
    email = headers.get(proxy.email_header)
    raw = headers.get(proxy.groups_header) if proxy.groups_header else None
    groups = _groups(raw.split(proxy.groups_separator) if raw else None)
    return signed_in(auth, email, groups, "proxy", address)


def _groups(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list | tuple):
        return ()
    return tuple(str(g).strip() for g in value if str(g).strip())


def gate() -> Identity:
    """Let the session in, or stop the script with a sign-in page or a refusal. Records each
    sign-in and refusal once per browser session in the audit trail."""
    config, sessions = data.store()
    who = current()
    auth = config.auth
    if auth is not None and auth.mode == "oidc" and who.why_not == "sign in":
        st.title("kneepoint")
        st.write("Sign in to see the fleet.")
        st.button("Sign in", type="primary", on_click=st.login)
        st.stop()
    if who.via in ("oidc", "proxy") and _first_sight(who):
        audit.sign_in(sessions.begin, who, time.time())
    if who.role is None:
        st.error(f"No access: {who.why_not}.")
        if who.via == "oidc":
            st.button("Sign out", on_click=st.logout)
        st.stop()
    if auth is not None and auth.mode == "none":
        st.warning(
            f"No sign-in: everyone who can reach this address uses kneepoint as "
            f"{who.role} (`auth: {{mode: none}}` in kneepoint.yaml).",
            icon=":material/lock_open:",
        )
    _sidebar(who)
    return who


def _sidebar(who: Identity) -> None:
    if who.via == "local":
        st.sidebar.caption("Local user (admin): no sign-in on loopback.")
        return
    st.sidebar.caption(f"Signed in as **{who.name}** ({who.role})")
    if who.via == "oidc":
        st.sidebar.button("Sign out", on_click=st.logout)


def _first_sight(who: Identity) -> bool:
    """Whether this sign-in is new: once per ID token (its issue time) in OIDC mode, across
    tabs and page loads of this app process; once per browser session in proxy mode, which
    has no token to tell sign-ins apart."""
    key: tuple[object, ...] = (who.name, who.role)
    if who.via == "oidc":
        key += (st.user.get("iat"),)
        seen = _seen_tokens()
        if key in seen:
            return False
        seen.add(key)
        return True
    if st.session_state.get(_SIGNED_IN) == key:
        return False
    st.session_state[_SIGNED_IN] = key
    return True


@st.cache_resource
def _seen_tokens() -> set[tuple[object, ...]]:
    return set()


def require_page(needed: Role, what: str) -> Identity:
    """Stop a page's script unless this session holds `needed` (checked on the server)."""
    who = current()
    try:
        require(who, needed, what)
    except Refused as refused:
        _, sessions = data.store()
        audit.refusal(sessions.begin, who, "page.open", what, str(refused), time.time())
        st.error(str(refused))
        st.stop()
    return who
