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
from streamlit.runtime.context import _get_client_context

from app import data
from kneepoint import audit
from kneepoint.auth import Identity, Refused, Role, anonymous, require, signed_in

_SIGNED_IN = "kneepoint-signed-in"


def peer_address() -> str | None:
    """The session connection's TCP peer, or None when there is none (not a browser's
    WebSocket). kneepoint starts its server trusting no X-Forwarded-For (FORWARDED_ALLOW_IPS
    is empty), so this is the peer itself, not what a client claims. Read from the session's
    client context: st.context.ip_address reports a loopback peer and no peer alike (None)."""
    context = _get_client_context()
    address = getattr(context, "remote_ip", None)
    return address if isinstance(address, str) else None


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
        verified = st.user.get("email_verified") in (True, "true")
        if not (verified or auth.oidc.trust_unverified_email):
            return replace(who, role=None, why_not=f"the provider has not verified {who.name}")
        signed_at = st.user.get("iat")
        if not isinstance(signed_at, int | float) or session_expired(
            float(signed_at), time.time(), auth.oidc.max_session
        ):
            return Identity("not signed in", None, "oidc", address=address, why_not="sign in")
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
    emails = headers.get_all(proxy.email_header)
    raws = headers.get_all(proxy.groups_header) if proxy.groups_header else []
    if len(emails) > 1 or len(raws) > 1:  # a proxy that appends instead of replacing
        return Identity(
            "unknown",
            None,
            "proxy",
            address=address,
            why_not="the identity headers came more than once",
        )
    raw = raws[0] if raws else None
    groups = _groups(raw.split(proxy.groups_separator) if raw else None)
    return signed_in(auth, emails[0] if emails else None, groups, "proxy", address)


def session_expired(signed_at: float, now: float, max_session: float) -> bool:
    """Whether an OIDC sign-in (its ID token's issue time) is older than auth.oidc.max_session."""
    return now - signed_at > max_session


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
