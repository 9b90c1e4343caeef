package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// serveDebug serves Go's pprof handlers on addr until ctx ends. Only a
// loopback address is accepted: a heap profile shows memory contents,
// including secrets held by the egress proxy.
func serveDebug(ctx context.Context, addr string, log *slog.Logger) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--debug-listen %q: %w", addr, err)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("--debug-listen %q: only a loopback address is allowed", addr)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	base, err := serveAside(ctx, "--debug-listen", addr, mux)
	if err != nil {
		return err
	}
	log.Info("pprof profiles", "url", base+"/debug/pprof/")
	return nil
}

// serveMetrics serves /metrics of g on addr until ctx ends (--metrics-listen).
func serveMetrics(ctx context.Context, addr string, g prometheus.Gatherer, log *slog.Logger) error {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	base, err := serveAside(ctx, "--metrics-listen", addr, mux)
	if err != nil {
		return err
	}
	log.Info("metrics", "url", base+"/metrics")
	return nil
}

// serveAside serves h on addr (the value of flag) until ctx ends, beside
// the API, and returns its base URL.
func serveAside(ctx context.Context, flag, addr string, h http.Handler) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flag, err)
	}
	srv := NewHTTPServer(h)
	go func() {
		<-ctx.Done()
		srv.Close()
	}()
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), nil
}
