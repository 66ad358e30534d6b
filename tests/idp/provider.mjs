// A real OpenID provider for the test suite: panva's oidc-provider (OpenID certified), configured with
// four users behind a real login form, two static clients, open dynamic registration, resource
// indicators with JWT access tokens, client credentials and RFC 8693 token exchange.
//
//   node tests/idp/provider.mjs --port PORT [--redirect URI]...
//
// Prints one JSON line on stdout when it listens: {"issuer": "http://127.0.0.1:PORT", ...}. Everything
// else (oidc-provider's notices included) goes to stderr. Test-only control endpoints live under /test/.
import * as crypto from 'node:crypto';
import * as http from 'node:http';
import { createRequire } from 'node:module';
import { fileURLToPath, pathToFileURL } from 'node:url';

// oidc-provider comes from the repository's .npm/ (scripts/test installs it), jose from beside it.
const npm = createRequire(fileURLToPath(new URL('../../.npm/node_modules/', import.meta.url)));
const providerPath = npm.resolve('oidc-provider');
const { Provider, errors } = await import(pathToFileURL(providerPath).href);
const jose = await import(pathToFileURL(createRequire(providerPath).resolve('jose')).href);
const { createMemoryAdapter } = await import(new URL('adapters/memory_adapter.js', pathToFileURL(providerPath)).href);

// oidc-provider's "you SHOULD change this default" notices use console.info: keep stdout for the ready line.
console.info = console.error;

const args = process.argv.slice(2);
const option = (name) => args.flatMap((a, i) => (a === name ? [args[i + 1]] : []));
const port = Number(option('--port')[0] ?? 0);

const CONSOLE = 'toolkeeper-console';
const AGENTS = 'toolkeeper-agents';
const TOKEN_EXCHANGE = 'urn:ietf:params:oauth:grant-type:token-exchange';
const TYPE_ACCESS_TOKEN = 'urn:ietf:params:oauth:token-type:access_token';
const TYPE_JWT = 'urn:ietf:params:oauth:token-type:jwt';
const TTL = 600;
// What a resource server (any loopback URL) accepts as scopes in its access tokens.
const RESOURCE_SCOPES = 'profile email groups';

const USERS = {
  ada: { password: 'ada-password', name: 'Ada Lovelace', groups: ['platform', 'approvers'] },
  grace: { password: 'grace-password', name: 'Grace Hopper', groups: ['auditors'] },
  linus: { password: 'linus-password', name: 'Linus Torvalds', groups: ['approvers'] },
  bob: { password: 'bob-password', name: 'Bob Nobody', groups: ['visitors'] },
};
const claimsOf = (sub) => {
  const u = USERS[sub];
  return {
    sub, name: u.name, preferred_username: sub,
    email: `${sub}@example.com`, email_verified: true, groups: [...u.groups],
  };
};

// Signing keys, made here so that /test/sign and token exchange can sign with them too. rsaKeys[0] signs;
// older RSA keys stay published (and accepted) after a rotation unless dropped.
const newKey = (type, alg, options) => ({
  ...crypto.generateKeyPairSync(type, options).privateKey.export({ format: 'jwk' }),
  kid: `${alg.toLowerCase()}-${crypto.randomBytes(6).toString('hex')}`, alg, use: 'sig',
});
let rsaKeys = [newKey('rsa', 'RS256', { modulusLength: 2048 })];
const ecKey = newKey('ec', 'ES256', { namedCurve: 'P-256' });
const privateJwks = () => [...rsaKeys.slice(0, 1), ecKey, ...rsaKeys.slice(1)];
const publicJwks = () => ({
  keys: privateJwks().map(({ d, p, q, dp, dq, qi, ...pub }) => pub),
});

// The console's redirect URIs: from the command line, replaceable at runtime by POST /test/redirects.
const redirects = { [CONSOLE]: option('--redirect').length ? option('--redirect') : ['http://127.0.0.1:9/callback'] };
// Logging out may send the browser back to any redirect URI or to the root of its origin.
const postLogout = (uris) => [...new Set(uris.flatMap((u) => [u, `${new URL(u).origin}/`]))];

// Kept across rebuilds of the provider (see build()): its cookies and everything it stores.
const cookieKeys = [crypto.randomBytes(32).toString('base64url')];
const adapter = createMemoryAdapter(15);

function configuration() {
  return {
    jwks: { keys: privateJwks() },
    adapter,
    cookies: { keys: cookieKeys },
    clients: [
      {
        client_id: CONSOLE,
        client_secret: 'console-secret-0123456789abcdef',
        // Registered as client_secret_basic; oidc-provider accepts a secret in the body (client_secret_post)
        // just the same for a client registered with either of the two.
        token_endpoint_auth_method: 'client_secret_basic',
        grant_types: ['authorization_code', 'refresh_token'],
        response_types: ['code'],
        redirect_uris: redirects[CONSOLE],
        post_logout_redirect_uris: postLogout(redirects[CONSOLE]),
      },
      {
        client_id: AGENTS,
        client_secret: 'agents-secret-0123456789abcdef',
        grant_types: ['client_credentials', TOKEN_EXCHANGE],
        response_types: [],
        redirect_uris: [],
      },
    ],
    async findAccount(ctx, sub) {
      if (!USERS[sub]) return undefined;
      return { accountId: sub, claims: async () => claimsOf(sub) };
    },
    claims: {
      openid: ['sub'],
      profile: ['name', 'preferred_username'],
      email: ['email', 'email_verified'],
      groups: ['groups'],
    },
    scopes: ['openid', 'profile', 'email', 'groups', 'offline_access'],
    responseTypes: ['code'], // the code flow only: no implicit or hybrid
    // The ID token carries every claim its scopes grant, not only sub: an RP reads groups from it.
    conformIdTokenClaims: false,
    pkce: { required: () => true }, // S256 is the only method oidc-provider 9 supports
    // A refresh token to every client that may use the grant (the console always, offline_access or not).
    issueRefreshToken: async (ctx, client) => client.grantTypeAllowed('refresh_token'),
    // User claims in access tokens (JWT ones carry them; client_id is added by oidc-provider itself).
    async extraTokenClaims(ctx, token) {
      if (!token.accountId || !USERS[token.accountId]) return undefined;
      const { groups, email } = claimsOf(token.accountId);
      return { groups, email };
    },
    clientBasedCORS: () => true,
    ttl: {
      AccessToken: TTL, ClientCredentials: TTL, IdToken: TTL, AuthorizationCode: 60,
      RefreshToken: 14 * 24 * 3600, Interaction: 3600, Session: 14 * 24 * 3600, Grant: 14 * 24 * 3600,
    },
    interactions: { url: (ctx, interaction) => `/interaction/${interaction.uid}` },
    features: {
      devInteractions: { enabled: false }, // it signs anyone in: the form below checks passwords
      clientCredentials: { enabled: true },
      registration: { enabled: true }, // open: the MCP SDK's OAuth client registers itself
      introspection: { enabled: true },
      revocation: { enabled: true },
      rpInitiatedLogout: { enabled: true, logoutSource },
      resourceIndicators: {
        enabled: true,
        defaultResource: async (ctx, client, oneOf) => oneOf,
        // The resource granted at /authorize is used at the token endpoint without being asked again.
        useGrantedResource: async () => true,
        async getResourceServerInfo(ctx, resource) {
          if (!/^http:\/\/(127\.0\.0\.1|localhost)[:/]/.test(resource)) throw new errors.InvalidTarget();
          return {
            scope: RESOURCE_SCOPES, audience: resource, accessTokenTTL: TTL,
            accessTokenFormat: 'jwt', jwt: { sign: { alg: 'RS256' } },
          };
        },
      },
    },
  };
}

// The provider is rebuilt when its keys or the console's redirect URIs change: oidc-provider reads both
// at construction only. One in-memory store serves them all, so sessions, grants, codes, tokens and
// registered clients carry over to the new instance.
let provider;
let handle;
function build(issuer) {
  provider = new Provider(issuer, configuration());
  provider.registerGrantType(TOKEN_EXCHANGE, tokenExchange, [
    'subject_token', 'subject_token_type', 'resource', 'audience', 'scope', 'requested_token_type',
  ], ['resource', 'audience']);
  // Why a token request failed goes to stderr: error_description stays generic ("grant request is invalid").
  provider.on('server_error', (ctx, error) => console.error('server_error', error));
  provider.on('grant.error', (ctx, error) => console.error('grant.error', error.error_detail ?? error.message));
  handle = provider.callback();
}

async function signJws(claims, { alg = 'RS256', kid, header = {} } = {}) {
  const keys = privateJwks().filter((k) => k.alg === alg && (!kid || k.kid === kid));
  if (!keys.length) throw new errors.InvalidRequest(`no ${alg} key${kid ? ` with kid ${kid}` : ''}`);
  const key = await jose.importJWK(keys[0], alg);
  return new jose.CompactSign(new TextEncoder().encode(JSON.stringify(claims)))
    .setProtectedHeader({ alg, kid: keys[0].kid, ...header })
    .sign(key);
}

// RFC 8693 token exchange: an access token this provider issued becomes one for another audience, with
// the requesting client recorded as the actor. Client authentication and the client's right to the grant
// are checked by oidc-provider before this runs.
async function tokenExchange(ctx) {
  const { params, client } = ctx.oidc;
  if (!params.subject_token) throw new errors.InvalidRequest('missing required parameter subject_token');
  if (![TYPE_ACCESS_TOKEN, TYPE_JWT].includes(params.subject_token_type)) {
    throw new errors.InvalidRequest('subject_token_type must be an access_token or jwt token type');
  }
  const many = (v) => (v === undefined ? [] : [v].flat());
  const audiences = [...many(params.resource), ...many(params.audience)];
  if (!audiences.length) throw new errors.InvalidRequest('a resource or an audience is required');
  for (const r of many(params.resource)) {
    if (!URL.canParse(r) || !/^http:\/\/(127\.0\.0\.1|localhost)[:/]/.test(r)) throw new errors.InvalidTarget();
  }
  let subject;
  try {
    ({ payload: subject } = await jose.jwtVerify(params.subject_token, jose.createLocalJWKSet(publicJwks()), {
      issuer: provider.issuer,
      algorithms: ['RS256', 'ES256'],
      ...(params.subject_token_type === TYPE_ACCESS_TOKEN ? { typ: 'at+jwt' } : {}),
    }));
  } catch (error) {
    throw new errors.InvalidGrant(`subject_token is invalid: ${error.message}`);
  }
  if (!subject.sub) throw new errors.InvalidGrant('subject_token has no sub');
  const now = Math.floor(Date.now() / 1000);
  const scope = params.scope ?? subject.scope;
  const claims = {
    iss: provider.issuer,
    sub: subject.sub,
    aud: audiences.length === 1 ? audiences[0] : audiences,
    iat: now,
    exp: now + TTL,
    jti: crypto.randomUUID(),
    client_id: client.clientId,
    ...(scope ? { scope } : {}),
    ...(subject.groups ? { groups: subject.groups } : {}),
    ...(subject.email ? { email: subject.email } : {}),
    // A chain of delegation keeps the earlier actors nested (RFC 8693 section 4.1).
    act: { sub: client.clientId, ...(subject.act ? { act: subject.act } : {}) },
  };
  ctx.body = {
    access_token: await signJws(claims, { header: { typ: 'at+jwt' } }),
    issued_token_type: TYPE_ACCESS_TOKEN,
    token_type: 'Bearer',
    expires_in: TTL,
    ...(scope ? { scope } : {}),
  };
}

// --- pages: login, consent (granted at once), logout ---------------------------------------------------------
const escape = (s) => String(s).replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
const page = (title, body) => `<!DOCTYPE html><html><head><meta charset="utf-8"><title>${escape(title)}</title></head>`
  + `<body><h1>${escape(title)}</h1>${body}</body></html>`;

function loginPage(uid, login = '', error = '') {
  return page('Sign in', `${error ? `<p id="error" class="error">${escape(error)}</p>` : ''}
<form method="post" action="/interaction/${escape(uid)}/login">
  <label>Login <input name="login" autocomplete="username" value="${escape(login)}" autofocus></label>
  <label>Password <input name="password" type="password" autocomplete="current-password"></label>
  <button id="submit" type="submit">Sign in</button>
</form>`);
}

// The logout confirmation submits itself, so a browser sent to end_session_endpoint signs out at once.
async function logoutSource(ctx, form) {
  ctx.body = page('Sign out', `${form}
<button id="submit" type="submit" form="op.logoutForm" name="logout" value="yes">Sign out</button>
<script>document.getElementById('submit').click()</script>`);
}

async function interaction(req, res, uid, action) {
  const details = await provider.interactionDetails(req, res);
  if (details.uid !== uid) throw new errors.SessionNotFound('interaction mismatch');
  const { prompt, params, session } = details;
  if (prompt.name === 'login') {
    if (action !== 'login' || req.method !== 'POST') return send(res, 200, loginPage(uid), 'text/html');
    const form = new URLSearchParams(await readBody(req));
    const login = form.get('login') ?? '';
    const user = Object.hasOwn(USERS, login) ? USERS[login] : undefined;
    if (!user || form.get('password') !== user.password) {
      return send(res, 200, loginPage(uid, login, 'Invalid login or password.'), 'text/html');
    }
    return provider.interactionFinished(req, res, { login: { accountId: login } }, { mergeWithLastSubmission: false });
  }
  if (prompt.name === 'consent') {
    // Consent is granted at once, for everything asked.
    const grant = details.grantId
      ? await provider.Grant.find(details.grantId)
      : new provider.Grant({ accountId: session.accountId, clientId: params.client_id });
    const missing = prompt.details;
    if (missing.missingOIDCScope) grant.addOIDCScope(missing.missingOIDCScope.join(' '));
    if (missing.missingOIDCClaims) grant.addOIDCClaims(missing.missingOIDCClaims);
    for (const [resource, scopes] of Object.entries(missing.missingResourceScopes ?? {})) {
      grant.addResourceScope(resource, scopes.join(' '));
    }
    const grantId = await grant.save();
    return provider.interactionFinished(req, res, { consent: details.grantId ? {} : { grantId } });
  }
  throw new errors.InvalidRequest(`unknown prompt ${prompt.name}`);
}

// --- test control endpoints -------------------------------------------------------------------------
const control = {
  async rotate({ drop_old: dropOld = false }) {
    const key = newKey('rsa', 'RS256', { modulusLength: 2048 });
    rsaKeys = dropOld ? [key] : [key, ...rsaKeys];
    build(provider.issuer);
    return { kid: key.kid };
  },
  async groups({ user, groups }) {
    if (!Object.hasOwn(USERS, user) || !Array.isArray(groups)) {
      throw new errors.InvalidRequest(`user: one of ${Object.keys(USERS)}; groups: a list`);
    }
    USERS[user].groups = groups.map(String);
    return { user, groups: USERS[user].groups };
  },
  async sign({ claims, alg = 'RS256', kid, header }) {
    return { token: await signJws(claims, { alg, kid, header }) };
  },
  async redirects({ client_id: clientId = CONSOLE, redirect_uris: uris }) {
    if (!Object.hasOwn(redirects, clientId)) throw new errors.InvalidRequest(`no static client ${clientId} to redirect`);
    if (!Array.isArray(uris) || !uris.length) throw new errors.InvalidRequest('redirect_uris: a non-empty list');
    redirects[clientId] = uris.map(String);
    build(provider.issuer);
    return { client_id: clientId, redirect_uris: redirects[clientId] };
  },
};

// --- the HTTP server ---------------------------------------------------------------------------------------
function readBody(req) {
  return new Promise((resolve, reject) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c)).on('error', reject);
    req.on('end', () => resolve(Buffer.concat(chunks).toString()));
  });
}

function send(res, status, body, type = 'application/json') {
  const text = type === 'application/json' ? JSON.stringify(body) : body;
  res.writeHead(status, { 'Content-Type': `${type}; charset=utf-8`, 'Cache-Control': 'no-store' });
  res.end(text);
}

const server = http.createServer(async (req, res) => {
  const { pathname } = new URL(req.url, 'http://x');
  try {
    const test = /^\/test\/(rotate|groups|sign|redirects)$/.exec(pathname);
    if (test && req.method === 'POST') {
      const text = await readBody(req);
      return send(res, 200, await control[test[1]](text ? JSON.parse(text) : {}));
    }
    const step = /^\/interaction\/([\w-]+)(?:\/(login))?$/.exec(pathname);
    if (step) return await interaction(req, res, step[1], step[2]);
    // RFC 8414 clients (MCP's among them) look here first: the same metadata as OpenID discovery.
    if (pathname === '/.well-known/oauth-authorization-server') req.url = '/.well-known/openid-configuration';
    return handle(req, res);
  } catch (error) {
    if (!(error instanceof errors.OIDCProviderError)) console.error(error);
    const status = error.statusCode ?? (error instanceof SyntaxError ? 400 : 500);
    const description = error.error_description ?? error.message;
    return send(res, status, { error: error.error ?? 'server_error', error_description: description });
  }
});

server.listen(port, '127.0.0.1', () => {
  const issuer = `http://127.0.0.1:${server.address().port}`;
  build(issuer);
  process.stdout.write(`${JSON.stringify({
    issuer,
    discovery: `${issuer}/.well-known/openid-configuration`,
    jwks_uri: `${issuer}/jwks`,
    kid: rsaKeys[0].kid,
    clients: { [CONSOLE]: redirects[CONSOLE], [AGENTS]: [] },
  })}\n`);
});
for (const signal of ['SIGTERM', 'SIGINT']) process.on(signal, () => process.exit(0));
