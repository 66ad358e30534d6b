"""Who: the people who sign in, the agents that call, and the principal every call carries.

No HTTP routes of its own: the wire layer asks it to check a token or a
sign-in and carries the answer (a `Principal`) to the engine, which puts it in
the policy input and the record.
"""

from toolkeeper.identity.issuer import IdentityError, Issuer, IssuerUnavailable
from toolkeeper.identity.oidc import ROLE_ORDER, Grant, NoRole, OidcClient, Person, SignIn, SignInRefused
from toolkeeper.identity.principal import Principal, chosen_claims, groups_of
from toolkeeper.identity.proxies import TrustedProxies
from toolkeeper.identity.setup import Identity, build_identity
from toolkeeper.identity.tokens import ASYMMETRIC, ClaimNames, TokenChecker, TokenRefused, looks_like_jwt

__all__ = ["ASYMMETRIC", "ROLE_ORDER", "ClaimNames", "Grant", "Identity", "IdentityError", "Issuer",
           "IssuerUnavailable", "NoRole", "OidcClient", "Person", "Principal", "SignIn", "SignInRefused",
           "TokenChecker", "TokenRefused", "TrustedProxies", "build_identity", "chosen_claims", "groups_of",
           "looks_like_jwt"]
