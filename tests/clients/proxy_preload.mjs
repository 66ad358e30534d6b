// Node's fetch ignores HTTPS_PROXY; this makes it use the proxy the environment names (the preload the
// interception how-to gives). Run with NODE_OPTIONS="--import /path/to/this/file", undici installed beside it.
import { EnvHttpProxyAgent, setGlobalDispatcher } from "undici";

setGlobalDispatcher(new EnvHttpProxyAgent());
