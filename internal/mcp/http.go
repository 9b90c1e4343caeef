package mcp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/spacesandbox/space/internal/httpapi"
	space "github.com/spacesandbox/space/sdk/go"
)

// inProcessURL is the base URL of the in-process API client; requests
// never leave the process (handlerTransport), so the host is never dialled.
const inProcessURL = "http://space.internal"

// Handler serves MCP over streamable HTTP for `space serve`'s /mcp: each
// tool call runs against api (the server's /v1 handler) in process, with
// the API key of the HTTP request that carried it. requireKey wraps the
// handler in the API's own key check (httpapi.API.RequireKey), so a
// request without a valid key is answered 401 before MCP sees it.
func Handler(api http.Handler, requireKey func(http.Handler) http.Handler, version string, log *slog.Logger) http.Handler {
	backend := func(ctx context.Context, extra *mcp.RequestExtra) (*space.Client, error) {
		if extra == nil || extra.Header == nil {
			return nil, errors.New("no API key")
		}
		key, _ := httpapi.APIKey(&http.Request{Header: extra.Header})
		if key == "" {
			return nil, errors.New("no API key: send Authorization: Bearer <api key>")
		}
		hc := &http.Client{Transport: handlerTransport{h: api, remote: extra.Header.Get(remoteHeader)}}
		return space.NewClient(inProcessURL, key, space.WithHTTPClient(hc), space.WithUserAgent("space-mcp")), nil
	}
	srv := New(backend, version)
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Logger: log,
		// Stateless: no session lives in this process, so a client goes on
		// across a server restart and behind a load balancer over several
		// servers (one store); every request carries its key. The tools
		// send the client no requests of their own.
		Stateless: true,
		// The API is not a localhost-only service: it is reached by the
		// names it is served under, and a valid API key is required.
		DisableLocalhostProtection: true,
	})
	// The /v1 calls carry the MCP client's address, set here (whatever
	// the client sent in this header is replaced).
	withRemote := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set(remoteHeader, r.RemoteAddr)
		h.ServeHTTP(w, r)
	})
	return requireKey(withRemote)
}

// remoteHeader carries an /mcp request's RemoteAddr to the /v1 calls its
// tools make.
const remoteHeader = "X-Space-Mcp-Remote-Addr"

// handlerTransport runs requests through an http.Handler in process,
// streaming the response body through a pipe.
type handlerTransport struct {
	h      http.Handler
	remote string // the requests' RemoteAddr
}

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancel(req.Context())
	r := req.Clone(ctx)
	r.RequestURI = req.URL.RequestURI()
	r.RemoteAddr = t.remote
	r.Header.Del(remoteHeader)
	if r.Body == nil {
		r.Body = http.NoBody
	}
	pr, pw := io.Pipe()
	w := &pipeWriter{header: http.Header{}, pw: pw, ready: make(chan struct{})}
	go func() {
		defer func() {
			if p := recover(); p != nil && p != http.ErrAbortHandler {
				pw.CloseWithError(errors.New("handler panicked"))
			}
		}()
		t.h.ServeHTTP(w, r)
		w.WriteHeader(http.StatusOK) // one that wrote nothing answered 200
		pw.Close()
	}()
	select {
	case <-w.ready:
	case <-ctx.Done():
		cancel()
		pr.Close()
		return nil, ctx.Err()
	}
	return &http.Response{
		Status: http.StatusText(w.status), StatusCode: w.status,
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: w.sent, Body: &cancelBody{ReadCloser: pr, cancel: cancel},
		ContentLength: -1, Request: req,
	}, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	b.cancel()
	return b.ReadCloser.Close()
}

// pipeWriter is the ResponseWriter of an in-process request.
type pipeWriter struct {
	header http.Header
	sent   http.Header
	status int
	pw     *io.PipeWriter
	once   sync.Once
	ready  chan struct{}
}

func (w *pipeWriter) Header() http.Header { return w.header }

func (w *pipeWriter) WriteHeader(code int) {
	w.once.Do(func() {
		w.status, w.sent = code, w.header.Clone()
		close(w.ready)
	})
}

func (w *pipeWriter) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	return w.pw.Write(b)
}

// Flush is a no-op: every Write reaches the reader (the pipe holds
// nothing back).
func (w *pipeWriter) Flush() {}
