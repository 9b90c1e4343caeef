package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// splitList flattens repeatable, comma-separated flag values into one list,
// dropping empty entries (so `--allow ”` is an empty list).
func splitList(vals []string) []string {
	out := []string{}
	for _, v := range vals {
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				out = append(out, s)
			}
		}
	}
	return out
}

// networkFlags adds --allow, --deny and --secret to create: the sandbox's
// egress policy and the secrets it may use.
type networkFlags struct {
	allow, deny, secrets []string
}

func (n *networkFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringArrayVar(&n.allow, "allow", nil, "destinations the sandbox may reach: host, *.domain[:port], * (public internet) or CIDR (comma list, repeatable; without --allow/--deny: no network)")
	f.StringArrayVar(&n.deny, "deny", nil, "destinations refused even when allowed (comma list, repeatable)")
	f.StringArrayVar(&n.secrets, "secret", nil, "secret NAME the sandbox may use through the egress proxy (comma list, repeatable; see: space secret)")
}

// apply sets the request's network and secrets from the flags given.
func (n *networkFlags) apply(cmd *cobra.Command, req *space.CreateSandboxRequest) {
	f := cmd.Flags()
	if f.Changed("allow") || f.Changed("deny") {
		req.Network = &space.NetworkPolicy{Allow: splitList(n.allow), Deny: splitList(n.deny)}
	}
	if s := splitList(n.secrets); len(s) > 0 {
		req.Secrets = s
	}
}

func (a *app) networkCommand() *cobra.Command {
	var (
		allow, deny []string
		asJSON      bool
	)
	cmd := &cobra.Command{
		Use:   "network <id> [--allow list] [--deny list]",
		Short: "Show or change a sandbox's network policy",
		Long: "Without --allow or --deny, show the sandbox's network policy and the secrets it may use.\n" +
			"With them, replace the lists given (an omitted list is kept; --deny '' clears it, --allow '' cuts\n" +
			"the network). The new policy applies to connections opened afterwards.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			ctx, id := cmd.Context(), args[0]
			n, err := c.GetNetwork(ctx, id)
			if err != nil {
				return err
			}
			f := cmd.Flags()
			if f.Changed("allow") || f.Changed("deny") {
				p := space.NetworkPolicy{Allow: n.Allow, Deny: n.Deny}
				if f.Changed("allow") {
					p.Allow = splitList(allow)
				}
				if f.Changed("deny") {
					p.Deny = splitList(deny)
				}
				if n, err = c.SetNetwork(ctx, id, p); err != nil {
					return err
				}
			}
			if asJSON {
				return printJSON(a.stdout, n)
			}
			fmt.Fprintf(a.stdout, "allow:   %s\ndeny:    %s\nsecrets: %s\n",
				fmtList(n.Allow, "- (no network)"), fmtList(n.Deny, "-"), fmtList(n.Secrets, "-"))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&allow, "allow", nil, "new allow list: host, *.domain[:port], * or CIDR (comma list, repeatable)")
	f.StringArrayVar(&deny, "deny", nil, "new deny list (comma list, repeatable)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func fmtList(l []string, empty string) string {
	if len(l) == 0 {
		return empty
	}
	return strings.Join(l, ", ")
}

func (a *app) egressCommand() *cobra.Command {
	var (
		limit  int
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "egress <id> [flags]",
		Short: "Show a sandbox's egress audit log (connections allowed and refused)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 {
				return usageError(cmd, "bad --limit %d", limit)
			}
			c, err := a.sdk()
			if err != nil {
				return err
			}
			recs, err := c.EgressLog(cmd.Context(), args[0], limit)
			if err != nil {
				return err
			}
			if asJSON {
				if recs == nil {
					recs = []space.EgressRecord{}
				}
				return printJSON(a.stdout, recs)
			}
			tw := newTable(a.stdout, "TIME", "DECISION", "DESTINATION", "SNI", "RULE/REASON", "UP", "DOWN", "SECRET")
			for _, r := range recs {
				row(tw, fmtTime(r.Time), r.Decision, net.JoinHostPort(r.Host, strconv.Itoa(r.Port)), dash(r.SNI),
					ruleReason(r), fmtBytes(r.BytesUp), fmtBytes(r.BytesDown), dash(r.Secret))
			}
			return tw.Flush()
		},
	}
	f := cmd.Flags()
	f.IntVar(&limit, "limit", 0, "at most this many of the latest records (server default when 0)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// ruleReason says why a connection was decided: the matching rule, the
// refusal reason, or both.
func ruleReason(r space.EgressRecord) string {
	switch {
	case r.Rule != "" && r.Reason != "":
		return r.Reason + " (" + r.Rule + ")"
	case r.Rule != "":
		return r.Rule
	default:
		return dash(r.Reason)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) secretCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "secret",
		Short: "Manage secrets the egress proxy injects into sandboxes' requests",
		Long: "A secret is stored on the server, bound to hosts. A sandbox created with --secret NAME sees only a\n" +
			"placeholder in $NAME; the egress proxy swaps it for the value on requests to the secret's hosts.",
	}
	cmd.AddCommand(a.secretSetCommand(), a.secretListCommand(), a.secretRmCommand())
	return cmd
}

func (a *app) secretSetCommand() *cobra.Command {
	var (
		hosts                 []string
		header, format        string
		basicAuth             bool
		basicUser, queryParam string
	)
	cmd := &cobra.Command{
		Use:   "set NAME --hosts list (--header H [--format F] | --basic-auth [--basic-auth-user U] | --query-param P) < value",
		Short: "Store or replace a secret; its value is read from stdin",
		Example: "  printf %s \"$GITHUB_TOKEN\" | space secret set GITHUB_TOKEN --hosts api.github.com --header Authorization --format 'Bearer {value}'\n" +
			"  space secret set PYPI_TOKEN --hosts upload.pypi.org --basic-auth-user __token__ < token.txt",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req := space.PutSecretRequest{Name: args[0], Hosts: splitList(hosts)}
			if len(req.Hosts) == 0 {
				return usageError(cmd, "--hosts is required")
			}
			f := cmd.Flags()
			modes := 0
			if header != "" {
				modes++
				req.Inject.Header, req.Inject.Format = header, format
			} else if f.Changed("format") {
				return usageError(cmd, "--format needs --header")
			}
			if basicAuth || f.Changed("basic-auth-user") {
				modes++
				req.Inject.BasicAuth = &struct {
					User string `json:"user,omitempty"`
				}{User: basicUser}
			}
			if queryParam != "" {
				modes++
				req.Inject.QueryParam = queryParam
			}
			if modes != 1 {
				return usageError(cmd, "give exactly one of --header, --basic-auth[-user] and --query-param")
			}
			value, err := a.readSecretValue()
			if err != nil {
				return err
			}
			req.Value = value
			c, err := a.sdk()
			if err != nil {
				return err
			}
			if err := c.PutSecret(cmd.Context(), req); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "secret %s stored for %s\n", req.Name, strings.Join(req.Hosts, ", "))
			return nil
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&hosts, "hosts", nil, "hosts the value may be sent to: exact names or *.domain, each with :port (443 when none; comma list, repeatable)")
	f.StringVar(&header, "header", "", "inject into this request header (e.g. Authorization)")
	f.StringVar(&format, "format", "", "with --header: the header value, {value} standing for the secret (e.g. 'Bearer {value}')")
	f.BoolVar(&basicAuth, "basic-auth", false, "inject as the HTTP basic-auth password")
	f.StringVar(&basicUser, "basic-auth-user", "", "inject as the basic-auth password, with this user name (implies --basic-auth)")
	f.StringVar(&queryParam, "query-param", "", "inject into this URL query parameter")
	return cmd
}

// readSecretValue reads the value from stdin, without echo when stdin is a
// terminal, and trims one trailing newline. The value is never printed.
func (a *app) readSecretValue() (string, error) {
	var b []byte
	var err error
	if f, ok := a.stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		fmt.Fprint(a.stderr, "secret value (not echoed): ")
		b, err = term.ReadPassword(int(f.Fd()))
		fmt.Fprintln(a.stderr)
	} else {
		// One byte more than the server accepts, so an oversized value is
		// refused there rather than silently cut here.
		b, err = io.ReadAll(io.LimitReader(a.stdin, 64<<10+3))
	}
	if err != nil {
		return "", fmt.Errorf("reading the secret value: %w", err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", errors.New("empty secret value: pass it on stdin (e.g. `printf %s \"$TOKEN\" | space secret set NAME ...`)")
	}
	return v, nil
}

func (a *app) secretListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List secrets (names and hosts; values are never shown)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			secrets, err := c.ListSecrets(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				if secrets == nil {
					secrets = []space.Secret{}
				}
				return printJSON(a.stdout, secrets)
			}
			tw := newTable(a.stdout, "NAME", "HOSTS", "CREATED")
			for _, s := range secrets {
				row(tw, s.Name, fmtList(s.Hosts, "-"), fmtTime(s.CreatedAt))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) secretRmCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME...",
		Short: "Delete secrets",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, names []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			failed := 0
			for _, name := range names {
				if err := c.DeleteSecret(cmd.Context(), name); err != nil {
					fmt.Fprintf(a.stderr, "space: %s: %s\n", name, a.explain(err))
					failed++
				}
			}
			if failed > 0 {
				return exitCode(1)
			}
			return nil
		},
	}
}
