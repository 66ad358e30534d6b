"""The identity settings (`auth:` in the config file) turned into the checkers serve uses, each issuer shared."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from toolkeeper.identity.issuer import Issuer
from toolkeeper.identity.oidc import OidcClient
from toolkeeper.identity.proxies import TrustedProxies
from toolkeeper.identity.tokens import ClaimNames, TokenChecker

ROLES = ("admin", "approver", "auditor")


@dataclass
class Identity:
    """What serve checks who calls with. `agents`: JWTs agents present instead of a static key; `mcp`: /mcp's
    access tokens, for its resource; `people`: the console's OIDC sign-in (None when off)."""

    public_url: str
    trusted: TrustedProxies
    agents: TokenChecker | None = None
    mcp: TokenChecker | None = None
    people: OidcClient | None = None
    issuers: dict[str, Issuer] = field(default_factory=dict)

    @property
    def mcp_resource(self) -> str:
        """/mcp's resource identifier (RFC 8707, RFC 9728): the audience its access tokens must name."""
        return f"{self.public_url}/mcp"

    @property
    def callback_url(self) -> str:
        """Where the provider sends a person back with a code: the redirect URI to register for the client."""
        return f"{self.public_url}/toolkeeper/oidc/callback"

    @property
    def signed_out_url(self) -> str:
        """Where the provider sends a person back after signing out there: the post-logout redirect URI."""
        return f"{self.public_url}/toolkeeper/oidc/signed-out"

    def describe(self) -> str:
        """Who may call, for serve's start line: empty when no `auth:` setting is given."""
        said = []
        if self.agents is not None:
            said.append(f"agents also by JWT from {self.agents.issuer.url}")
        if self.people is not None:
            said.append(f"people sign in through {getattr(self.people, 'issuer_url', 'OIDC')}")
        if self.mcp is not None:
            said.append(f"/mcp takes OAuth tokens from {self.mcp.issuer.url} for {self.mcp_resource}")
        return ", ".join(said)

    async def close(self) -> None:
        if self.people is not None:
            await self.people.close()
        for issuer in self.issuers.values():
            await issuer.close()


def role_mapping(pairs: tuple[str, ...]) -> dict[str, set[str]]:
    """`auth.oidc.roles` (GROUP=ROLE pairs) as each group's roles; ValueError naming a pair that is wrong."""
    mapping: dict[str, set[str]] = {}
    for pair in pairs:
        group, equals, role = pair.rpartition("=")
        if not equals or not group or role not in ROLES:
            raise ValueError(f"auth.oidc.roles: {pair!r} is not GROUP=ROLE with a role among {', '.join(ROLES)}")
        mapping.setdefault(group, set()).add(role)
    return mapping


def build_identity(settings: Any) -> Identity:
    """The checkers the settings ask for; ValueError saying what is missing or wrong (serve's start refuses)."""
    public_url = (settings.public_url or settings.local_url).rstrip("/")
    identity = Identity(public_url=public_url, trusted=TrustedProxies(settings.trusted_proxy))

    def issuer(url: str, jwks_url: str | None = None) -> Issuer:
        key = url  # Auth0's and Entra v1's issuers end in "/": the name is kept exactly as the provider says it
        if key not in identity.issuers:
            identity.issuers[key] = Issuer(key, jwks_url=jwks_url)
        return identity.issuers[key]

    if settings.auth_agents_jwt_issuer:
        if not settings.auth_agents_jwt_audience:
            raise ValueError("auth.agents.jwt needs an audience: without one, a token made for any other service "
                             "would let an agent in")
        names = ClaimNames(user=settings.auth_agents_jwt_user_claim, agent=settings.auth_agents_jwt_agent_claim,
                           groups=settings.auth_agents_jwt_groups_claim, shown=settings.auth_agents_jwt_claims)
        identity.agents = TokenChecker(issuer(settings.auth_agents_jwt_issuer, settings.auth_agents_jwt_jwks_url),
                                       settings.auth_agents_jwt_audience, algorithms=settings.auth_algorithms,
                                       names=names)
    if settings.auth_mcp_issuer:
        same = identity.agents is not None and identity.agents.issuer.url == settings.auth_mcp_issuer
        names = identity.agents.names if same else ClaimNames(shown=settings.auth_agents_jwt_claims)
        identity.mcp = TokenChecker(issuer(settings.auth_mcp_issuer), (identity.mcp_resource,),
                                    algorithms=settings.auth_algorithms, names=names)
    if settings.auth_oidc_issuer:
        if not settings.auth_oidc_client_id:
            raise ValueError("auth.oidc needs client_id (and client_secret, unless the client is public)")
        roles = role_mapping(settings.auth_oidc_roles)  # checked now: a typo in a role stops serve, not a sign-in
        if not roles:
            raise ValueError("auth.oidc needs roles (GROUP=ROLE, or `roles: {GROUP: ROLE}`): without them, no one "
                             "who signs in could do anything")
        identity.people = OidcClient(issuer(settings.auth_oidc_issuer), settings.auth_oidc_client_id,
                                     settings.auth_oidc_client_secret, redirect_uri=identity.callback_url,
                                     signed_out_uri=identity.signed_out_url,
                                     roles=roles, scopes=settings.auth_oidc_scopes,
                                     groups_claim=settings.auth_oidc_groups_claim,
                                     refresh_every=settings.auth_oidc_refresh, algorithms=settings.auth_algorithms)
    return identity
