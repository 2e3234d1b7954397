"""The Secret type and redact_url: a secret's value comes out only through .reveal(), and a
URL is shown with its credentials masked, for every platform's webhook form."""

from __future__ import annotations

import copy
import io
import logging
import pickle
import secrets as random
import traceback

import pytest
from pydantic import ValidationError

from kneepoint.config import Channel, Config, ConfigError, Target, parse_config
from kneepoint.secrets import (
    HookURL,
    ScrubbingFormatter,
    Secret,
    SecretURL,
    redact_url,
    reveal,
    revealed,
    scrub,
)


def canary(label: str = "") -> str:
    return f"kpcanary{label}{random.token_hex(8)}"


def test_a_secret_shows_only_its_mask_and_reveals_its_value_on_request() -> None:
    value = canary()
    secret = Secret(value)
    assert secret.reveal() == value and reveal(secret) == value and reveal(value) == value
    shown = [str(secret), repr(secret), f"{secret}", f"{secret!r}", f"{secret:>20}"]
    shown += ["%s %r" % (secret, secret), "{}".format(secret)]  # noqa: UP031, UP032
    assert all(value not in text for text in shown), shown
    assert str(secret) == "***" and repr(secret) == "Secret('***')"
    assert value not in repr({"k": secret}) and value not in repr([secret])


def test_a_secret_compares_hashes_copies_and_pickles_by_its_value() -> None:
    value = canary()
    secret = Secret(value)
    assert secret == Secret(value) and secret != Secret(value + "x")
    assert secret != value  # never equal to the bare text: a comparison is no way to leak it
    assert hash(secret) == hash(Secret(value)) and len({secret, Secret(value)}) == 1
    assert bool(secret) and not Secret("")
    assert copy.deepcopy(secret).reveal() == value
    assert pickle.loads(pickle.dumps(secret)).reveal() == value
    assert SecretURL("http://h/x") != Secret("http://h/x")  # different kinds of secret


def test_a_secret_holds_only_text_and_its_error_never_quotes_the_value() -> None:
    with pytest.raises(TypeError) as refused:
        Secret(123456789)  # type: ignore[arg-type]
    assert "123456789" not in str(refused.value) and "int" in str(refused.value)


def every_secret(values: dict[str, str]) -> Config:
    """A Config with a secret in each field that holds one."""
    return Config.model_validate(
        {
            "database": f"postgresql+psycopg://kp:{values['db']}@db:5432/k",
            "targets": [
                {
                    "name": "a",
                    "kind": "vllm",
                    "url": f"http://u:{values['target_pw']}@h:8000/metrics?token={values['target_q']}",
                    "headers": {"Authorization": f"Bearer {values['target_header']}"},
                }
            ],
            "prometheus": {
                "url": f"http://p:{values['prom_pw']}@prom:9090",
                "headers": {"X-Scope-OrgID": values["prom_header"]},
            },
            "channels": [
                {
                    "name": "hook",
                    "type": "webhook",
                    "url": f"https://hooks.example/{values['hook_path']}",
                    "secret": values["hook_secret"],
                    "headers": {"X-Token": values["hook_header"]},
                },
                {"name": "tg", "type": "telegram", "token": values["tg"], "chat_id": "-1"},
                {"name": "pd", "type": "pagerduty", "routing_key": values["pd"]},
            ],
            "heartbeat": {"url": f"https://hc-ping.com/{values['heartbeat']}"},
            "auth": {
                "mode": "oidc",
                "oidc": {
                    "issuer": "https://idp.example",
                    "client_id": "kneepoint",
                    "client_secret": values["oidc_client"],
                    "cookie_secret": values["oidc_cookie"],
                    "redirect_uri": "https://kneepoint.example/oauth2callback",
                },
                "allowed_domains": ["example.com"],
            },
        }
    )


SECRET_FIELDS = (
    "db",
    "target_pw",
    "target_q",
    "target_header",
    "prom_pw",
    "prom_header",
    "hook_path",
    "hook_secret",
    "hook_header",
    "tg",
    "pd",
    "heartbeat",
    "oidc_client",
    "oidc_cookie",
)


def test_no_repr_or_dump_of_a_config_shows_a_secret() -> None:
    values = {name: canary(name) for name in SECRET_FIELDS}
    config = every_secret(values)
    shown = {
        "repr": repr(config),
        "str": str(config),
        "dump": repr(config.model_dump()),
        "json": config.model_dump_json(),
        "json_by_alias": config.model_dump_json(by_alias=True),
        "channels": repr(config.channels),
        "targets": f"{config.targets}",
    }
    for how, text in shown.items():
        leaked = [name for name, value in values.items() if value in text]
        assert not leaked, (how, leaked)
    # What is shown of the URLs: where they point, not their credentials.
    assert "postgresql+psycopg://***@db:5432/k" in shown["json"]
    assert "http://***@h:8000/metrics?token=***" in shown["json"]
    assert "https://hooks.example/…" in shown["json"] and "https://hc-ping.com/…" in shown["json"]
    # The values are all there, for whoever asks for them by name.
    assert config.database.reveal().endswith(f":{values['db']}@db:5432/k")
    assert revealed(config.targets[0].headers) == {
        "Authorization": f"Bearer {values['target_header']}"
    }
    assert config.channels[1].token is not None
    assert config.channels[1].token.reveal() == values["tg"]
    # model_dump keeps the Secret objects, so a dump validates back to the same config.
    assert Config.model_validate(config.model_dump()) == config


@pytest.mark.parametrize(
    ("yaml_value", "field"),
    [
        ("{targets: [{name: a, kind: vllm, url: 'ftp://u:CANARY@h/x'}]}", "targets[0].url"),
        ("{targets: [{name: a, kind: vllm, url: 'http://h/ CANARY'}]}", "targets[0].url"),
        ("{targets: [{name: a, kind: vllm, url: 'http://h/', headers: {A: [CANARY]}}]}", "A"),
        ("{prometheus: {url: 'CANARY'}}", "prometheus.url"),
        ("{channels: [{name: c, type: slack, url: 'hooks.slack.com/services/CANARY'}]}", "url"),
        ("{channels: [{name: c, type: slack, url: 'http://h:CANARY/'}]}", "channels[0].url"),
        ("{channels: [{name: c, type: nope, url: 'https://h/CANARY'}]}", "channels[0].type"),
        ("{channels: [{name: c, type: slack, secret: {CANARY: 1}}]}", "channels[0].secret"),
        ("{heartbeat: {url: 'https:///CANARY'}}", "heartbeat.url"),
        ("{database: [CANARY]}", "database"),
        (
            "{auth: {mode: oidc, oidc: {issuer: 'https://i', client_id: k, client_secret: [CANARY],"
            " redirect_uri: 'https://k/oauth2callback'}}}",
            "auth.oidc.client_secret",
        ),
    ],
)
def test_a_config_error_never_quotes_a_secret(yaml_value: str, field: str) -> None:
    value = canary()
    text = yaml_value.replace("CANARY", value)
    with pytest.raises(ConfigError) as refused:
        parse_config(text)
    message = str(refused.value)
    assert field in message and value not in message, message
    assert refused.value.__cause__ is None and refused.value.__suppress_context__
    assert value not in "".join(traceback.format_exception(refused.value))
    # Even pydantic's own error text, for whoever validates a model directly, omits it.
    with pytest.raises(ValidationError) as direct:
        import yaml

        Config.model_validate(yaml.safe_load(text))
    assert value not in str(direct.value) and value not in repr(direct.value)


def test_a_model_validated_in_code_hides_its_input_too() -> None:
    value = canary()
    with pytest.raises(ValidationError) as refused:
        Channel.model_validate({"name": "c", "type": "slack", "url": f"http://h:{value}/"})
    assert value not in str(refused.value)
    with pytest.raises(ValidationError) as refused:
        Target.model_validate({"name": "a", "kind": "vllm", "url": f"gopher://{value}"})
    assert value not in str(refused.value)


# url -> (redact_url(url), redact_url(url, path=False))
URLS = {
    # Slack incoming webhook: the three path parts are the token
    "https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX": (
        "https://hooks.slack.com/services/…",
        "https://hooks.slack.com/…",
    ),
    # Discord: /api/webhooks/<id>/<token>
    "https://discord.com/api/webhooks/123456789012345678/abcDEF-ghiJKL_mnoPQR": (
        "https://discord.com/api/webhooks/…",
        "https://discord.com/…",
    ),
    # Telegram: the bot token in the path
    "https://api.telegram.org/bot123456:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw/sendMessage": (
        "https://api.telegram.org/bot…/sendMessage",
        "https://api.telegram.org/…",
    ),
    # Teams: an old connector URL and a Workflows (Logic Apps) URL signed with sig=
    "https://contoso.webhook.office.com/webhookb2/0000-aaaa@1111-bbbb/IncomingWebhook/"
    "c0ffee/2222-cccc": (
        "https://contoso.webhook.office.com/…",
        "https://contoso.webhook.office.com/…",
    ),
    "https://prod-42.westeurope.logic.azure.com:443/workflows/abc123/triggers/manual/paths/"
    "invoke?api-version=2016-06-01&sp=%2Ftriggers%2Fmanual%2Frun&sv=1.0&sig=S1GnAtUrE": (
        "https://prod-42.westeurope.logic.azure.com:443/…?api-version=***&sp=***&sv=***&sig=***",
        "https://prod-42.westeurope.logic.azure.com:443/…",
    ),
    # Feishu and Lark: /open-apis/bot/v2/hook/<token>
    "https://open.feishu.cn/open-apis/bot/v2/hook/0a1b2c3d-4e5f-6789-abcd-ef0123456789": (
        "https://open.feishu.cn/open-apis/bot/v2/hook/…",
        "https://open.feishu.cn/…",
    ),
    "https://open.larksuite.com/open-apis/bot/v2/hook/0a1b2c3d-4e5f": (
        "https://open.larksuite.com/open-apis/bot/v2/hook/…",
        "https://open.larksuite.com/…",
    ),
    # DingTalk: ?access_token=; WeCom: ?key=
    "https://oapi.dingtalk.com/robot/send?access_token=d1n9t4lk": (
        "https://oapi.dingtalk.com/robot/send?access_token=***",
        "https://oapi.dingtalk.com/…",
    ),
    "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=693a91f6-7xxx": (
        "https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key=***",
        "https://qyapi.weixin.qq.com/…",
    ),
    # A target or database: user info and query values masked, the path kept
    "http://scraper:pa55word@10.0.0.11:8000/metrics?token=t0k3n&x": (
        "http://***@10.0.0.11:8000/metrics?token=***&***",
        "http://***@10.0.0.11:8000/…",
    ),
    "postgresql+psycopg://kneepoint:s3cret@db.internal:5432/kneepoint?sslmode=require": (
        "postgresql+psycopg://***@db.internal:5432/kneepoint?sslmode=***",
        "postgresql+psycopg://***@db.internal:5432/…",
    ),
    "https://t0ken@example.com/x#fragment": (
        "https://***@example.com/x#…",
        "https://***@example.com/…",
    ),
    "http://[::1]:9090/metrics": ("http://[::1]:9090/metrics", "http://[::1]:9090/…"),
    "sqlite:///var/lib/kneepoint/kneepoint.db": (
        "sqlite:///var/lib/kneepoint/kneepoint.db",
        "sqlite:///…",
    ),
    "http://127.0.0.1:8000": ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    # Broken URLs: nothing of what may be a token is shown
    "http://hooks.example:T0KEN/": ("http://hooks.example:***/", "http://hooks.example:***"),
    "http://[hooks.example/T0KEN": ("http://…", "http://…"),
    "hooks.slack.com/services/T0KEN": ("…", "…"),
}


@pytest.mark.parametrize("url", URLS)
def test_redact_url_masks_each_platforms_token(url: str) -> None:
    with_path, without_path = URLS[url]
    assert redact_url(url) == with_path
    assert redact_url(url, path=False) == without_path
    # The URL types print the same way: a target's keeps its path, a hook's does not.
    # (Not remembered: a hook's path is a secret to `scrub`, and these paths are examples.)
    assert str(SecretURL(url, remember=False)) == with_path
    assert str(HookURL(url, remember=False)) == without_path


def test_scrub_takes_every_known_secret_and_its_parts_out_of_text() -> None:
    password, token, header, hook = canary(), canary(), canary(), canary()
    SecretURL(f"http://user:{password}@h:8000/metrics?token={token}")
    Secret(f"Bearer {header}")
    HookURL(f"https://hooks.slack.com/services/T0/B0/{hook}")
    text = (
        f"connect to http://user:{password}@h:8000/metrics?token={token} failed; "
        f"password {password}, token {token}; sent Bearer {header} then {header}; "
        f"POST https://hooks.slack.com/services/T0/B0/{hook} and again /services/T0/B0/{hook}"
    )
    cleaned = scrub(text)
    for value in (password, token, header, hook):
        assert value not in cleaned, cleaned
    assert "http://***@h:8000/metrics?token=***" in cleaned
    assert "https://hooks.slack.com/…" in cleaned
    assert scrub("nothing secret here") == "nothing secret here"


def test_scrub_finds_a_percent_encoded_password_in_its_decoded_form() -> None:
    decoded = canary() + "/@:"
    encoded = decoded.replace("/", "%2F").replace("@", "%40").replace(":", "%3A")
    SecretURL(f"postgresql://kp:{encoded}@db/k")
    assert decoded not in scrub(f'password authentication failed: "{decoded}"')


def test_scrub_is_given_a_short_lived_secret_without_remembering_it() -> None:
    value = canary()
    once = HookURL(f"https://oapi.dingtalk.com/robot/send?access_token={value}", remember=False)
    assert value not in scrub(f"error at {once.reveal()}", once)
    assert value in scrub(f"error at {once.reveal()}")  # not remembered


def test_log_lines_and_their_tracebacks_are_scrubbed() -> None:
    value = canary()
    Secret(value)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(ScrubbingFormatter("%(levelname)s %(message)s"))
    logger = logging.getLogger("tests.security.scrubbed")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        logger.warning("sent %s to the platform", value)
        try:
            raise RuntimeError(f"the platform said {value}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    written = stream.getvalue()
    assert "sent *** to the platform" in written
    assert "RuntimeError: the platform said ***" in written
    assert value not in written
