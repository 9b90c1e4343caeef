package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
)

// forwardCommand serves a sandbox's port on a local address: a browser or
// any HTTP client reaches the server in the sandbox without the API key
// (the command adds it), WebSockets included.
func (a *app) forwardCommand() *cobra.Command {
	var listen string
	cmd := &cobra.Command{
		Use:   "forward <id> <port>",
		Short: "Serve a sandbox's HTTP port on a local address (127.0.0.1 by default) until interrupted",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var port int
			if _, err := fmt.Sscan(args[1], &port); err != nil || port < 1 || port > 65535 {
				return usageError(cmd, "port: a number from 1 to 65535")
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			// Fail now, not on the first request, when the sandbox is not
			// there or not the caller's.
			if _, err := c.GetSandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return err
			}
			rp := &httputil.ReverseProxy{
				Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetXForwarded() },
				Transport:     c.PortTransport(args[0], port),
				FlushInterval: -1,
			}
			srv := &http.Server{Handler: rp, ReadHeaderTimeout: 30 * time.Second}
			fmt.Fprintf(a.stdout, "forwarding http://%s → %s port %d (Ctrl-C stops)\n", ln.Addr(), args[0], port)
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			go func() {
				<-ctx.Done()
				sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				defer cancel()
				_ = srv.Shutdown(sctx)
			}()
			if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:0", "local address to serve on (port 0: any free one)")
	return cmd
}
