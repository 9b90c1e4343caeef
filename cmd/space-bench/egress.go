package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/spacesandbox/space/internal/egress"
)

// Egress figures: how many requests and downloads are timed per row.
const (
	egressRequests     = 200
	egressDownloads    = 5
	egressDownloadSize = 100 << 20
)

// egressRows measures the egress proxy (internal/egress, in this process)
// against a direct connection to the same loopback upstream, side by side
// in the same loop: latency of one plain HTTP and one HTTPS GET, on a new
// connection and on a kept-alive one, with TLS relayed as is (a sandbox
// without secrets) and intercepted (a sandbox with a secret bound, whose
// placeholder is swapped on every request), and the time of a 100 MiB
// download. The in-sandbox leg (the agent's loopback endpoint and the
// tunnel over the agent channel) is not included.
func (b *bench) egressRows() error {
	e, err := startEgressBench()
	if err != nil {
		return fmt.Errorf("egress bench: %w", err)
	}
	defer e.close()

	get := func(c *http.Client, u, auth string) error {
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			return err
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return err
		}
		if resp.StatusCode != 200 {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		if want := resp.ContentLength; want >= 0 && n != want {
			return fmt.Errorf("GET %s: %d of %d bytes", u, n, want)
		}
		return nil
	}
	timed := func(c *http.Client, u, auth string) (time.Duration, error) {
		t0 := time.Now()
		err := get(c, u, auth)
		return time.Since(t0), err
	}

	httpURL := fmt.Sprintf("http://allowed.test:%d/", e.httpPort)
	tlsURL := fmt.Sprintf("https://allowed.test:%d/", e.tlsPort)
	directHTTP := fmt.Sprintf("http://127.0.0.1:%d/", e.httpPort)
	directTLS := fmt.Sprintf("https://127.0.0.1:%d/", e.tlsPort)
	for _, keep := range []bool{false, true} {
		conn := "new connection"
		if keep {
			conn = "kept-alive connection"
		}
		for _, c := range []struct {
			name, raw      string
			via, url, auth string
			direct         string
		}{
			{"egress proxy: HTTP GET, " + conn, "direct HTTP GET", e.plainProxy, httpURL, "", directHTTP},
			{"egress proxy: HTTPS GET, TLS passthrough, " + conn, "direct HTTPS GET", e.plainProxy, tlsURL, "", directTLS},
			{"egress proxy: HTTPS GET, TLS intercepted + secret, " + conn, "direct HTTPS GET", e.secretProxy, tlsURL, "Bearer " + e.placeholder, directTLS},
		} {
			r := row{name: c.name, rawName: c.raw + ", " + conn}
			pc, dc := e.client(c.via, keep), e.client("", keep)
			if keep { // open the connections outside the timings
				if err := get(pc, c.url, c.auth); err != nil {
					return err
				}
				if err := get(dc, c.direct, ""); err != nil {
					return err
				}
			}
			for range egressRequests {
				d, err := timed(pc, c.url, c.auth)
				if err != nil {
					return err
				}
				r.space = append(r.space, d)
				if d, err = timed(dc, c.direct, ""); err != nil {
					return err
				}
				r.raw = append(r.raw, d)
			}
			pc.CloseIdleConnections()
			dc.CloseIdleConnections()
			b.rows = append(b.rows, r)
		}
	}

	size := "?size=" + strconv.Itoa(egressDownloadSize)
	pass := row{name: "egress proxy: 100 MiB HTTPS download, TLS passthrough", rawName: "direct HTTPS download"}
	icpt := row{name: "egress proxy: 100 MiB HTTPS download, TLS intercepted + secret", rawName: "direct HTTPS download"}
	pc, ic, dc := e.client(e.plainProxy, true), e.client(e.secretProxy, true), e.client("", true)
	for range egressDownloads {
		d, err := timed(dc, directTLS+size, "")
		if err != nil {
			return err
		}
		pass.raw, icpt.raw = append(pass.raw, d), append(icpt.raw, d)
		if d, err = timed(pc, tlsURL+size, ""); err != nil {
			return err
		}
		pass.space = append(pass.space, d)
		if d, err = timed(ic, tlsURL+size, "Bearer "+e.placeholder); err != nil {
			return err
		}
		icpt.space = append(icpt.space, d)
	}
	for _, c := range []*http.Client{pc, ic, dc} {
		c.CloseIdleConnections()
	}
	b.rows = append(b.rows, pass, icpt)

	added := func(name string) string {
		for _, r := range b.rows {
			if r.name == name {
				return ms(pct(r.space, .5) - pct(r.raw, .5))
			}
		}
		return "?"
	}
	mbps := func(ds []time.Duration) float64 {
		return float64(egressDownloadSize) / (1 << 20) / pct(ds, .5).Seconds()
	}
	b.notes = append(b.notes, fmt.Sprintf("Egress proxy rows: the host-side proxy (internal/egress) in this process, "+
		"a loopback upstream named by an operator Hosts entry, requests and direct requests interleaved; the sandbox-side leg "+
		"(127.0.0.1:3128 in the sandbox, tunnelled over the agent channel) is not included. "+
		"Added p50 latency per request, new connection / kept alive: plain HTTP %s / %s ms, TLS passthrough %s / %s ms, "+
		"TLS intercepted with a secret %s / %s ms. 100 MiB download (p50): direct %.0f MiB/s, passthrough %.0f MiB/s, intercepted %.0f MiB/s.",
		added("egress proxy: HTTP GET, new connection"), added("egress proxy: HTTP GET, kept-alive connection"),
		added("egress proxy: HTTPS GET, TLS passthrough, new connection"), added("egress proxy: HTTPS GET, TLS passthrough, kept-alive connection"),
		added("egress proxy: HTTPS GET, TLS intercepted + secret, new connection"), added("egress proxy: HTTPS GET, TLS intercepted + secret, kept-alive connection"),
		mbps(pass.raw), mbps(pass.space), mbps(icpt.space)))
	return nil
}

// egressBench is an in-process egress proxy serving two sandboxes (one
// without secrets, one with a secret bound to allowed.test) on loopback
// listeners standing in for the agent tunnel, and an HTTP and an HTTPS
// upstream. A request answers "ok", or ?size=N bytes.
type egressBench struct {
	proxy                   *egress.Proxy
	httpPort, tlsPort       int
	plainProxy, secretProxy string // proxy listener addresses
	placeholder             string
	upstreamCAs, clientCAs  *x509.CertPool

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closer []func()
}

func startEgressBench() (_ *egressBench, err error) {
	e := &egressBench{}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	cert, caPool, err := benchCert("allowed.test")
	if err != nil {
		return nil, err
	}
	e.upstreamCAs = caPool
	chunk := make([]byte, 1<<20)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("size"))
		if n <= 0 {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for n > 0 {
			k, err := w.Write(chunk[:min(n, len(chunk))])
			if err != nil {
				return
			}
			n -= k
		}
	})
	quiet := log.New(io.Discard, "", 0)
	for _, useTLS := range []bool{false, true} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		if useTLS {
			ln = tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, NextProtos: []string{"http/1.1"}})
			e.tlsPort = port
		} else {
			e.httpPort = port
		}
		srv := &http.Server{Handler: h, ErrorLog: quiet}
		go srv.Serve(ln)
		e.closer = append(e.closer, func() { srv.Close() })
	}

	lo := []net.IP{net.ParseIP("127.0.0.1")}
	e.proxy, err = egress.New(egress.Config{
		Hosts:      map[string][]net.IP{"allowed.test": lo},
		AllowCIDRs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")},
		RootCAs:    caPool,
	})
	if err != nil {
		return nil, err
	}
	pol, err := egress.ParsePolicy(fmt.Sprintf("allowed.test:%d,allowed.test:%d", e.httpPort, e.tlsPort), "")
	if err != nil {
		return nil, err
	}
	e.clientCAs = caPool.Clone()
	e.placeholder = egress.NewPlaceholder()
	for _, id := range []string{"bench-plain", "bench-secret"} {
		if err := e.proxy.SetPolicy(id, pol); err != nil {
			return nil, err
		}
		if id == "bench-secret" {
			sec := egress.Secret{Name: "BENCH_TOKEN", Value: []byte("bench-value"), Hosts: []string{fmt.Sprintf("allowed.test:%d", e.tlsPort)},
				Inject: egress.Injection{Header: "Authorization", Format: "Bearer {value}"}}
			if err := e.proxy.BindSecrets(id, map[string]egress.Secret{e.placeholder: sec}); err != nil {
				return nil, err
			}
			ca, err := e.proxy.CAFor(id)
			if err != nil {
				return nil, err
			}
			e.clientCAs.AppendCertsFromPEM(ca)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		e.closer = append(e.closer, func() { ln.Close() })
		if id == "bench-plain" {
			e.plainProxy = ln.Addr().String()
		} else {
			e.secretProxy = ln.Addr().String()
		}
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				e.wg.Add(1)
				go func() {
					defer e.wg.Done()
					e.proxy.ServeConn(e.ctx, id, c)
				}()
			}
		}()
	}
	return e, nil
}

// client returns an HTTP/1.1 client through the proxy listener at via, or
// straight to the upstream (verified as allowed.test) when via is "".
func (e *egressBench) client(via string, keepAlive bool) *http.Client {
	tr := &http.Transport{DisableKeepAlives: !keepAlive, MaxIdleConnsPerHost: 1}
	if via == "" {
		tr.TLSClientConfig = &tls.Config{RootCAs: e.upstreamCAs, ServerName: "allowed.test"}
	} else {
		tr.Proxy = http.ProxyURL(&url.URL{Scheme: "http", Host: via})
		tr.TLSClientConfig = &tls.Config{RootCAs: e.clientCAs}
	}
	return &http.Client{Transport: tr, Timeout: 5 * time.Minute}
}

func (e *egressBench) close() {
	for _, f := range e.closer {
		f()
	}
	e.cancel()
	e.wg.Wait()
}

// benchCert returns a certificate for name signed by a fresh CA, and a pool
// holding that CA.
func benchCert(name string) (tls.Certificate, *x509.CertPool, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "space-bench upstream CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTpl, caTpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leafTpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}, pool, nil
}
