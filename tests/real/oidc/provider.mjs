// A real OpenID Connect provider for kneepoint's sign-in tests: panva's certified
// `oidc-provider` (8.x: it runs on Debian bookworm's own nodejs 18 as well as on Node 20),
// one confidential client, a few accounts with e-mail and groups, and a small login form of
// its own (any password: this provider exists only for tests).
//
//   OIDC_CLIENT_SECRET=... node provider.mjs --port 0 --client-id kneepoint \
//       --redirect-uri http://localhost:8501/oauth2callback [--accounts accounts.json]
//
// Its packages are installed outside the checkout by scripts/setup-oidc-provider; the test
// fixture (tests/real/oidc_provider.py) runs a copy of this file next to them. It prints one
// line, `listening <issuer>`, once it answers; the issuer is http://127.0.0.1:<port> (plain
// http on loopback, which Authlib accepts), and `signed in <email>` for each sign-in.
import { generateKeyPairSync, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import Provider, { interactionPolicy } from 'oidc-provider';

const { values: args } = parseArgs({
  options: {
    host: { type: 'string', default: '127.0.0.1' },
    port: { type: 'string', default: '0' },
    'client-id': { type: 'string' },
    'redirect-uri': { type: 'string', multiple: true },
    accounts: { type: 'string' },
  },
});
const clientSecret = process.env.OIDC_CLIENT_SECRET;
if (!args['client-id'] || !args['redirect-uri'] || !clientSecret) {
  console.error('usage: OIDC_CLIENT_SECRET=... provider.mjs --client-id ID --redirect-uri URI');
  process.exit(2);
}

const ACCOUNTS = args.accounts
  ? JSON.parse(readFileSync(args.accounts, 'utf8'))
  : [
    { email: 'viewer@example.com', name: 'Vera Viewer', groups: ['readers'] },
    { email: 'operator@example.com', name: 'Otto Operator', groups: ['oncall'] },
    { email: 'admin@example.com', name: 'Ada Admin', groups: ['sre-leads', 'oncall'] },
    { email: 'stranger@example.org', name: 'Stan Stranger', groups: ['oncall'] },
  ];
const byId = new Map(ACCOUNTS.map((account) => [account.email.toLowerCase(), account]));

function findAccount(ctx, id) {
  const account = byId.get(id);
  if (!account) return undefined;
  return {
    accountId: id,
    async claims() {
      return {
        sub: id,
        email: account.email,
        email_verified: true,
        name: account.name,
        groups: account.groups,
      };
    },
  };
}

// Streamlit's st.login asks for `prompt=select_account`; the base policy knows only login and
// consent, so add the account chooser as a requestable prompt, answered by the login form.
const policy = interactionPolicy.base();
policy.add(new interactionPolicy.Prompt({ name: 'select_account', requestable: true }), 0);

const server = createServer();
await new Promise((resolve) => server.listen(Number(args.port), args.host, resolve));
const issuer = `http://${args.host}:${server.address().port}`;

const { privateKey } = generateKeyPairSync('rsa', { modulusLength: 2048 });
const provider = new Provider(issuer, {
  clients: [{
    client_id: args['client-id'],
    client_secret: clientSecret,
    redirect_uris: args['redirect-uri'],
    post_logout_redirect_uris: args['redirect-uri'],
    grant_types: ['authorization_code'],
    response_types: ['code'],
  }],
  jwks: { keys: [{ ...privateKey.export({ format: 'jwk' }), kid: 'k1', use: 'sig', alg: 'RS256' }] },
  cookies: { keys: [randomBytes(32).toString('hex')] },
  findAccount,
  ttl: { AccessToken: 600, Grant: 3600, IdToken: 600, Interaction: 600, Session: 3600 },
  // Claims in the ID token too, not only from the userinfo endpoint: Streamlit keeps what
  // the ID token says (Authlib's parsed `userinfo`), as most providers' ID tokens carry.
  conformIdTokenClaims: false,
  scopes: ['openid', 'email', 'profile', 'groups', 'offline_access'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  // Every authorization code must come with an S256 code challenge: the tests then prove
  // that Streamlit's login sends one.
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: false },
    // st.logout ends the provider's session too; a plain page asks first (the default one
    // loads a web font from the internet).
    rpInitiatedLogout: {
      enabled: true,
      async logoutSource(ctx, form) {
        ctx.type = 'html';
        ctx.body = `<!doctype html>
<html><head><meta charset="utf-8"><title>Test provider sign-out</title></head>
<body><h1>Sign out of the test provider?</h1>${form}
<button type="submit" form="op.logoutForm" value="yes" name="logout">Yes, sign me out</button>
<button type="submit" form="op.logoutForm">No, stay signed in</button>
</body></html>`;
      },
    },
  },
  interactions: {
    policy,
    url: (ctx, interaction) => `/interaction/${interaction.uid}`,
  },
  // A first-party client: every scope and claim it asks for is granted without a consent
  // screen (as an organisation's own provider does for its own apps).
  async loadExistingGrant(ctx) {
    const { oidc } = ctx;
    const grantId = oidc.result?.consent?.grantId || oidc.session.grantIdFor(oidc.client.clientId);
    const grant = grantId
      ? await oidc.provider.Grant.find(grantId)
      : new oidc.provider.Grant({ clientId: oidc.client.clientId, accountId: oidc.session.accountId });
    grant.addOIDCScope([...oidc.requestParamScopes].join(' '));
    await grant.save();
    return grant;
  },
});

const escape = (text) => String(text).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);

function loginPage(uid, message) {
  const choices = ACCOUNTS.map((a) => `<li>${escape(a.email)} (${a.groups.map(escape).join(', ')})</li>`).join('');
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>Test provider sign-in</title></head>
<body>
<h1>Sign in to the test provider</h1>
${message ? `<p role="alert">${escape(message)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
  <label>E-mail <input name="email" type="email" autocomplete="username" required autofocus></label>
  <label>Password <input name="password" type="password" autocomplete="current-password" required></label>
  <button type="submit">Sign in</button>
</form>
<p>Accounts (any password):</p><ul>${choices}</ul>
</body></html>`;
}

async function readForm(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  return new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
}

provider.use(async (ctx, next) => {
  const match = ctx.path.match(/^\/interaction\/([^/]+)(\/login)?$/);
  if (!match) return next();
  const [, uid, login] = match;
  const details = await provider.interactionDetails(ctx.req, ctx.res);
  if (details.uid !== uid) ctx.throw(400, 'interaction mismatch');
  ctx.set('cache-control', 'no-store');
  if (!login && ctx.method === 'GET') {
    ctx.type = 'html';
    ctx.body = loginPage(uid);
    return undefined;
  }
  if (login && ctx.method === 'POST') {
    const form = await readForm(ctx.req);
    const email = (form.get('email') || '').trim().toLowerCase();
    if (!byId.has(email) || !form.get('password')) {
      ctx.status = 401;
      ctx.type = 'html';
      ctx.body = loginPage(uid, `no account ${email} here`);
      return undefined;
    }
    console.log(`signed in ${email}`);
    const result = { select_account: {}, login: { accountId: email } };
    await provider.interactionFinished(ctx.req, ctx.res, result, { mergeWithLastSubmission: false });
    ctx.respond = false;
    return undefined;
  }
  return ctx.throw(405);
});

server.on('request', provider.callback());
process.on('SIGTERM', () => server.close(() => process.exit(0)));
console.log(`listening ${issuer}`);
