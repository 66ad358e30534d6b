"""A JSON Web Token checked as OpenID Connect and RFC 9068 say, and read into a principal.

Checked, in this order, before any claim is read: the header's algorithm is
on the allow-list (asymmetric ones only: never `none`, never an HMAC whose
"key" would be the provider's public one); the signature verifies with the
issuer's key for the header's key id; `iss` is the issuer; `aud` holds one of
the expected audiences; `exp` is in the future and `nbf`/`iat` are not (a
minute's leeway for clocks). Whatever fails, the token is refused with a reason
that says what, and never what the token held.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from toolkeeper.identity.issuer import IdentityError, Issuer
from toolkeeper.identity.principal import Principal, chosen_claims, groups_of

# The signatures a provider's public keys make; HS* and `none` are never accepted, whatever the settings say.
ASYMMETRIC = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")
DEFAULT_ALGORITHMS = ("RS256", "PS256", "ES256", "EdDSA")
LEEWAY = 60
CACHED_TOKENS = 4096  # checked tokens kept until they expire: an agent sends the same one with every request
MAX_TOKEN_CHARACTERS = 16 * 1024
_JWS = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


class TokenRefused(IdentityError):
    """The token is not one toolkeeper accepts: the message says which check failed."""


def looks_like_jwt(text: str) -> bool:
    """Three base64url parts, the first a JSON header: a token to check, not a static key to look up."""
    return text.startswith("eyJ") and _JWS.fullmatch(text) is not None  # a long one is refused by the check, saying so


@dataclass(frozen=True)
class ClaimNames:
    """Which claims name what: the operator's `user_claim`, `agent_claim`, `groups_claim`, and the ones rules see."""

    user: str = "sub"
    agent: str | None = None  # None: the token's client (client_id, else azp), else its subject
    groups: str = "groups"
    shown: tuple[str, ...] = ()


class TokenChecker:
    def __init__(self, issuer: Issuer, audiences: tuple[str, ...], *,
                 algorithms: tuple[str, ...] = DEFAULT_ALGORITHMS, names: ClaimNames | None = None):
        refused = sorted(set(algorithms) - set(ASYMMETRIC))
        if refused:
            raise ValueError(f"algorithms {', '.join(refused)} are not accepted: only a provider's public-key "
                             f"signatures are ({', '.join(ASYMMETRIC)})")
        if not audiences:
            raise ValueError("an audience is required: without one, a token made for any other service would do")
        # PyJWT and `cryptography` (50 ms) load when tokens are to be checked, at the start, not in a request;
        # a toolkeeper without `auth:` never imports them
        import jwt  # noqa: F401
        self.issuer = issuer
        self.audiences = audiences
        self.algorithms = algorithms
        self.names = names or ClaimNames()
        self._checked: OrderedDict[bytes, tuple[float, Principal]] = OrderedDict()

    async def claims(self, token: str, *, audiences: tuple[str, ...] | None = None,
                     nonce: str | None = None) -> dict[str, Any]:
        """The token's claims once every check holds; TokenRefused (or IssuerUnavailable) otherwise."""
        import jwt  # loaded by __init__

        if len(token) > MAX_TOKEN_CHARACTERS:
            raise TokenRefused("the token is longer than any toolkeeper accepts")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenRefused("the token is not a signed JWT") from None
        if "crit" in header:  # RFC 7515 4.1.11: an extension the verifier does not process makes the token invalid
            raise TokenRefused("the token names critical header extensions (crit), which toolkeeper does not process")
        alg, kid = header.get("alg"), header.get("kid")
        if alg not in self.algorithms:
            raise TokenRefused(f"the token is signed with {str(alg)[:20]!r}, not one of the accepted algorithms "
                               f"({', '.join(self.algorithms)})")
        jwk = await self.issuer.key(kid if isinstance(kid, str) else None, alg)
        if jwk is None:
            raise TokenRefused(f"the token's signing key ({str(kid)[:64]!r}) is not among {self.issuer.url}'s keys")
        try:
            key = jwt.PyJWK(jwk, algorithm=alg).key
            claims = jwt.decode(token, key, algorithms=[alg], audience=list(audiences or self.audiences),
                                issuer=self.issuer.url, leeway=LEEWAY,
                                options={"require": ["exp", "iss", "aud"], "verify_iat": True})
        except jwt.ExpiredSignatureError:
            raise TokenRefused("the token has expired") from None
        except jwt.InvalidAudienceError:
            raise TokenRefused("the token was issued for another audience than this one") from None
        except jwt.InvalidIssuerError:
            raise TokenRefused(f"the token was not issued by {self.issuer.url}") from None
        except jwt.InvalidSignatureError:
            raise TokenRefused("the token's signature does not verify with the issuer's key") from None
        except jwt.PyJWTError as exc:
            raise TokenRefused(f"the token is refused: {str(exc)[:200]}") from None
        if nonce is not None and claims.get("nonce") != nonce:
            raise TokenRefused("the ID token's nonce is not the one this sign-in sent")
        return claims

    async def principal(self, token: str, *, agent: str | None = None,
                        audiences: tuple[str, ...] | None = None) -> Principal:
        """Who a token says a call is for. `agent`: the agent's own name when a listed key already names it.

        A token that passed is remembered (by its digest) until its `exp`: the signature check is most of a
        request's cost here (bench/identity.py), and it would give the same answer every time until then."""
        digest = hashlib.sha256(f"{agent}\n{audiences}\n{token}".encode()).digest()
        known = self._checked.get(digest)
        if known is not None and known[0] > time.time():
            self._checked.move_to_end(digest)
            return known[1]
        claims = await self.claims(token, audiences=audiences)
        principal = self.read(claims, agent=agent)
        expires = claims.get("exp")
        if isinstance(expires, (int, float)):
            self._checked[digest] = (float(expires), principal)
            if len(self._checked) > CACHED_TOKENS:
                self._checked.popitem(last=False)
        return principal

    def read(self, claims: dict[str, Any], *, agent: str | None = None) -> Principal:
        names = self.names
        user = claims.get(names.user)
        if not isinstance(user, str) or not user:
            raise TokenRefused(f"the token has no {names.user!r} claim naming the user")
        if agent is None:
            candidates = (names.agent,) if names.agent else ("client_id", "azp", "sub")
            agent = next((str(claims[name]) for name in candidates if isinstance(claims.get(name), str)), None)
            if agent is None:
                raise TokenRefused(f"the token has no {names.agent!r} claim naming the agent")
        return Principal(agent=agent[:128], user=user[:256], groups=groups_of(claims.get(names.groups)),
                         issuer=self.issuer.url, claims=chosen_claims(claims, names.shown))
