package agent

import (
	"bytes"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"

	"github.com/spacesandbox/space/internal/agentproto"
	"github.com/spacesandbox/space/internal/errdefs"
)

// Trust store locations of Debian-based templates.
const (
	CABundle   = "/etc/ssl/certs/ca-certificates.crt"
	CALocalPEM = "/usr/local/share/ca-certificates/space-egress.crt"
)

// NodePreload is where the agent writes nodePreloadJS. The host names it
// in NODE_OPTIONS (internal/sandbox/network.go) for sandboxes with egress.
const NodePreload = "/usr/local/lib/space/node-egress.cjs"

// dropNodePreload removes the host's NODE_OPTIONS (which only names the
// preload) from env when the preload file is not there: Node refuses to
// start at all when a --require'd module is missing. A NODE_OPTIONS the
// caller chose is left alone. It reports whether it removed it.
func dropNodePreload(env map[string]string, exists func(string) bool) bool {
	if env["NODE_OPTIONS"] != "--require "+NodePreload || exists(NodePreload) {
		return false
	}
	delete(env, "NODE_OPTIONS")
	return true
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// startEgress opens the in-sandbox proxy endpoint (idempotent: after a
// restore the listener is already there with the rest of the agent's
// memory), installs the sandbox's egress CA certificate and writes the
// Node preload that routes fetch through the proxy.
func (a *Agent) startEgress(cfg agentproto.EgressInit) error {
	if cfg.CACertPEM != "" {
		if err := installCA([]byte(cfg.CACertPEM)); err != nil {
			a.log.Warn("install egress CA", "err", err)
		}
	}
	if err := writeIfChanged(NodePreload, []byte(nodePreloadJS)); err != nil {
		a.log.Warn("write node egress preload", "err", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.egressLn != nil {
		return nil
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:3128"
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		return errdefs.InvalidArgument("egress listen address must be loopback, got %q", cfg.Listen)
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errdefs.Newf(errdefs.ErrUnavailable, "egress listener: %v", err)
	}
	a.egressLn = ln
	go a.serveEgress(ln)
	return nil
}

// serveEgress tunnels every local connection to the host proxy over a
// stream of the current session. With no session (the host is away) the
// connection is closed: egress fails closed.
func (a *Agent) serveEgress(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go a.tunnel(c)
	}
}

func (a *Agent) tunnel(c net.Conn) {
	defer c.Close()
	a.mu.Lock()
	sess := a.sess
	a.mu.Unlock()
	if sess == nil {
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		return
	}
	defer st.Close()
	if _, err := io.WriteString(st, agentproto.StreamEgress+"\n"); err != nil {
		return
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		io.Copy(st, c)
		st.Close() // yamux: half-close our sending side
	}()
	io.Copy(c, st)
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
	wg.Wait()
}

// installCA adds pem to the system bundle (once) and as a local CA file,
// so curl, git, pip, Python and Node (NODE_EXTRA_CA_CERTS) trust it.
func installCA(pem []byte) error {
	if err := os.MkdirAll("/usr/local/share/ca-certificates", 0o755); err == nil {
		_ = os.WriteFile(CALocalPEM, pem, 0o644)
	}
	cur, err := os.ReadFile(CABundle)
	if err != nil && !os.IsNotExist(err) {
		return err
	}
	if bytes.Contains(cur, bytes.TrimSpace(pem)) {
		return nil
	}
	f, err := os.OpenFile(CABundle, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	if len(cur) > 0 && cur[len(cur)-1] != '\n' {
		f.WriteString("\n")
	}
	_, err = f.Write(append(bytes.TrimSpace(pem), '\n'))
	return err
}

// writeIfChanged writes data to path (mode 0644, parents 0755) unless it
// already holds exactly that, replacing it atomically.
func writeIfChanged(path string, data []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, data) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	if err := os.Chmod(tmp, 0o644); err != nil { // whatever the umask
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// nodePreloadJS is loaded into every Node process of a sandbox with egress
// (NODE_OPTIONS=--require). Node's global fetch (undici) ignores
// HTTP(S)_PROXY, and the base template's Node 18 with undici 5.15 has no
// EnvHttpProxyAgent, so it installs a global dispatcher that sends each
// request through a ProxyAgent, or straight to loopback and NO_PROXY hosts.
// undici is loaded only on the first request (it costs a Node start about
// as much again), and any failure before that leaves Node as it was. The
// proxy enforces the policy either way: this is convenience, not security.
const nodePreloadJS = `'use strict';
// Written by the space agent. Node's fetch (undici) ignores HTTP(S)_PROXY;
// this preload (NODE_OPTIONS=--require) routes it through the sandbox's
// egress proxy, except NO_PROXY and loopback hosts, which go direct.
// Best effort: if anything is missing, Node is left as it was.
(function () {
  try {
    var env = process.env;
    var first = function (names) {
      for (var i = 0; i < names.length; i++) if (env[names[i]]) return env[names[i]];
      return '';
    };
    var httpsProxy = first(['https_proxy', 'HTTPS_PROXY', 'http_proxy', 'HTTP_PROXY']);
    var httpProxy = first(['http_proxy', 'HTTP_PROXY', 'https_proxy', 'HTTPS_PROXY']);
    var key = Symbol.for('undici.globalDispatcher.1');
    if ((!httpsProxy && !httpProxy) || globalThis[key] !== undefined) return;
    var id = null;
    ['undici', '/usr/share/nodejs/undici'].some(function (m) {
      try { require.resolve(m); id = m; return true; } catch (e) { return false; }
    });
    if (!id) return;
    var noProxy = first(['no_proxy', 'NO_PROXY']).toLowerCase().split(/[\s,]+/).filter(Boolean);

    // direct reports whether a URL skips the proxy: loopback, or a
    // NO_PROXY entry ("*", "host", ".suffix", "*.suffix", "host:port").
    var direct = function (u) {
      var host = u.hostname.toLowerCase().replace(/^\[|\]$/g, '').replace(/\.$/, '');
      if (host === 'localhost' || /\.localhost$/.test(host) || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host)) return true;
      var port = u.port || (u.protocol === 'https:' ? '443' : '80');
      return noProxy.some(function (e) {
        if (e === '*') return true;
        var p = '';
        var m = /^\[(.*)\](?::(\d+))?$/.exec(e) || (e.split(':').length === 2 ? /^(.*):(\d+)$/.exec(e) : null);
        if (m) { e = m[1]; p = m[2] || ''; }
        if (p && p !== port) return false;
        e = e.replace(/^\*?\./, '');
        return host === e || host.endsWith('.' + e);
      });
    };

    // The real dispatcher is built on first use, so Node processes that
    // never fetch do not pay for loading undici.
    var real = null;
    var load = function () {
      if (real) return real;
      var u = require(id);
      var Router = class extends u.Dispatcher {
        constructor () {
          super();
          this.direct = this.watch(new u.Agent());
          this.proxies = new Map();
        }
        watch (d) {
          var self = this;
          ['connect', 'disconnect', 'connectionError', 'drain'].forEach(function (ev) {
            d.on(ev, function () { self.emit.apply(self, [ev].concat(Array.prototype.slice.call(arguments))); });
          });
          return d;
        }
        route (origin) {
          var url = new URL(String(origin));
          if (direct(url)) return this.direct;
          var p = url.protocol === 'http:' ? httpProxy : httpsProxy;
          var d = this.proxies.get(p);
          if (!d) {
            d = this.watch(new u.ProxyAgent(p));
            this.proxies.set(p, d);
          }
          return d;
        }
        dispatch (opts, handler) {
          return this.route(opts.origin).dispatch(opts, handler);
        }
        all (fn) {
          return Promise.all([this.direct].concat(Array.from(this.proxies.values())).map(fn)).then(function () {});
        }
        close (cb) {
          var p = this.all(function (d) { return d.close(); });
          if (typeof cb !== 'function') return p;
          p.then(function () { cb(null, null); }, function (err) { cb(err, null); });
        }
        destroy (err, cb) {
          if (typeof err === 'function') { cb = err; err = null; }
          var p = this.all(function (d) { return d.destroy(err); });
          if (typeof cb !== 'function') return p;
          p.then(function () { cb(null, null); }, function (e) { cb(e, null); });
        }
      };
      real = new Router();
      return real;
    };
    var lazy = new Proxy({}, {
      get: function (_, k) {
        var r = load();
        var v = r[k];
        return typeof v === 'function' ? v.bind(r) : v;
      },
      set: function (_, k, v) { load()[k] = v; return true; },
      has: function (_, k) { return k in load(); },
      getPrototypeOf: function () { return Object.getPrototypeOf(load()); }
    });
    // What undici's setGlobalDispatcher does, without loading undici.
    Object.defineProperty(globalThis, key, { value: lazy, writable: true, enumerable: false, configurable: false });
  } catch (e) {}
})();
`
