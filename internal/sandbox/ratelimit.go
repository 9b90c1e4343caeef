package sandbox

import (
	"context"
	"sync"

	"golang.org/x/time/rate"

	"github.com/spacesandbox/space/internal/errdefs"
)

// rateLimits holds each team's token bucket of API requests.
type rateLimits struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

// AllowRequest takes one request of c from its team's rate limit: the
// quota's MaxRPS requests per second, of which a second's worth may come
// at once. Admin keys and teams without a limit pass. A refusal is
// ErrRateLimited (429 rate_limited): the next request may pass within a
// second. The limit is per server, in memory: a restart starts full.
func (s *Service) AllowRequest(ctx context.Context, c Caller) error {
	if c.Admin || c.Team == "" {
		return nil
	}
	q, _, err := s.Quota(ctx, c.Team)
	if err != nil {
		return err
	}
	s.rates.mu.Lock()
	lim := s.rates.m[c.Team]
	switch {
	case q.MaxRPS <= 0:
		delete(s.rates.m, c.Team)
		s.rates.mu.Unlock()
		return nil
	case lim == nil:
		if s.rates.m == nil {
			s.rates.m = map[string]*rate.Limiter{}
		}
		lim = rate.NewLimiter(rate.Limit(q.MaxRPS), q.MaxRPS)
		s.rates.m[c.Team] = lim
	case lim.Burst() != q.MaxRPS: // the quota changed: a full bucket of the new rate
		lim = rate.NewLimiter(rate.Limit(q.MaxRPS), q.MaxRPS)
		s.rates.m[c.Team] = lim
	}
	s.rates.mu.Unlock()
	if !lim.Allow() {
		return errdefs.Newf(errdefs.ErrRateLimited, "team %s sent more than its %d requests per second; retry in a second", c.Team, q.MaxRPS)
	}
	return nil
}
