"""The reasons a token or a key set is refused: jwt_verify_lib's status texts, which Envoy logs and answers with
(its ``jwt_authn`` filter), so that access logs and 401 bodies read as Istio's do."""

from __future__ import annotations

BAD_FORMAT = "Jwt is not in the form of Header.Payload.Signature"
BAD_HEADER = "Jwt header is an invalid Base64url input or an invalid JSON"
BAD_ALG = "Jwt header [alg] field is not a string"
UNSUPPORTED_ALG = "Jwt header [alg] field value is invalid"
BAD_KID = "Jwt header [kid] field is not a string"
BAD_PAYLOAD = "Jwt payload is an invalid Base64 or an invalid JSON"
BAD_SIGNATURE_ENCODING = "Jwt signature is an invalid Base64"
UNKNOWN_ISSUER = "Jwt issuer is not configured"
NOT_YET_VALID = "Jwt not yet valid"
EXPIRED = "Jwt is expired"
AUDIENCE_NOT_ALLOWED = "Audiences in Jwt are not allowed"
VERIFICATION_FAILS = "Jwt verification fails"
NO_MATCHING_KEY = "Jwks doesn't have key to match kid or alg from Jwt"
JWKS_FETCH_FAILED = "Jwks remote fetch is failed"
JWKS_NOT_JSON = "Jwks is an invalid JSON"
JWKS_NO_KEYS = "Jwks does not have [keys] field"
JWKS_KEYS_NOT_ARRAY = "[keys] in Jwks is not an array"
JWKS_NO_VALID_KEYS = "Jwks doesn't have any valid public key"
