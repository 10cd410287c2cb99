/*
 * TokenRefresh.pml: a model of Sources/Auth/TokenRefreshStateMachine.swift, the decisions of
 * TokenRefreshCoordinator (Sources/Auth/TokenRefreshCoordinator.swift), driven the way
 * AuthenticatedRequestEngine drives it: each request takes a stamp, reads the provider's token,
 * sends, and after a 401 asks once more and retries once.
 *
 * The machine's transitions below follow the Swift code line for line (the names are the Swift
 * names); each runs in one atomic step, as the coordinator runs them under its lock. Left out:
 * expiry dates (proactive and expired-token refreshes), the loop guard's window (disabled here,
 * as with `window: .zero`) and the hash history's bound. Waiter and refresh ids are given out as
 * the Swift machine gives them out, so a trace of this model can be replayed through the Swift
 * machine: Tests/AuthTests/TokenRefreshModelTests.swift does that for random simulations
 * (`spin -n<seed>`), and compares every decision.
 *
 * The world: NC concurrent requests; a server that accepts a token issued after its last expiry;
 * one expiry at any moment; a refresh that succeeds, fails (at most FAILURES times) or times out
 * (at most TIMEOUTS times, at any moment, also after its result); a waiting request that may be
 * cancelled (at most CANCELS times).
 *
 * Checked exhaustively (Scripts/spin.sh, in .ci/run):
 * - assertions: a 401 to a token older than the current one never starts a refresh, nor a 401
 *   to a token whose refresh failed or timed out while the request was on its way (a storm of
 *   stragglers costs one refresh); refreshes started <= expiries + failed and timed-out refreshes
 *   (one refresh per token expiry, no loop);
 * - valid end states: no request is left waiting when everything else has ended;
 * - LTL `served`: every request ends (checked with two requests: the search with three takes
 *   minutes, and the safety run already checks that none is left waiting).
 */
/* spin-ltl: -DNC=2 */

#ifndef NC
#define NC        3
#endif
#define FAILURES  1
#define TIMEOUTS  1
#define CANCELS   1
#define MAXW      8

/* Actions (TokenRefreshStateMachine.Action) and errors. */
#define SEND      1
#define SEND_READ 2
#define WAIT      4
#define START     5
#define FAIL      6
#define E_FAILED  1
#define E_TIMEOUT 2

/* ---- the machine's state ---- */
bool refreshing = false;
byte rId;            /* the refresh in flight */
byte rGen;           /* the generation it replaces */
bool waiting[MAXW];  /* its waiters */
byte curTok = 0;     /* 0: no current token */
byte curGen = 0;
byte lastGen = 0;
byte epoch = 0;
int  previous = 0;   /* bit t: token t was current once and was replaced */
bool lfValid = false;
byte lfGen;
byte lfEpoch;
byte lfErr;
byte lastW = 0;
byte lastR = 0;
int  abandoned = 0;  /* bit r: refresh r timed out and may still return */
byte abandonedGen[4];

/* ---- one transition's result ---- */
byte act;
byte actW;
byte actR;
byte actTok;
byte actGen;
byte actEpoch;
byte actErr;
int  doneWaiters;    /* a completion's waiters, as bits */
byte cw;             /* complete()'s cursor */
byte doneOutcome;    /* 1: success, 2: failure */

/* ---- the world ---- */
byte provider = 1;   /* the token the provider returns */
byte nextTok = 2;    /* the next token the server issues */
byte minValid = 1;   /* the server accepts tokens >= minValid */
byte expiries = 0;
byte failuresLeft = FAILURES;
byte timeoutsLeft = TIMEOUTS;
byte cancelsLeft = CANCELS;
byte badEnds = 0;    /* refreshes that failed or timed out */
byte starts = 0;
byte finished = 0;
byte owner[MAXW];
/* Ghosts, for the checks only: the generation of the token each request holds, and whether a
   refresh meant to replace that token failed or timed out while the request held it. */
bool holding[NC];
byte heldGen[NC];
bool straggler[NC];
byte cr;
chan answer[NC] = [1] of { byte, byte, byte, byte, byte };  /* outcome, tok, gen, epoch, err */

inline issue() {
    actTok = curTok; actGen = curGen; actEpoch = epoch
}

inline adopt(tok) {
    if
    :: curTok != 0 -> previous = previous | (1 << curTok)
    :: else -> skip
    fi;
    lastGen++;
    curGen = lastGen;
    curTok = tok
}

inline join(me) {
    lastW++;
    assert(lastW < MAXW);
    waiting[lastW] = true;
    owner[lastW] = me;
    act = WAIT; actW = lastW
}

inline startRefreshAndWait(me) {
    lastW++;
    assert(lastW < MAXW);
    waiting[lastW] = true;
    owner[lastW] = me;
    lastR++;
    assert(lastR < 4);
    refreshing = true;
    rId = lastR;
    rGen = curGen;
    starts++;
    assert(starts <= expiries + badEnds);  /* one refresh per expiry: no loop */
    act = START; actW = lastW; actR = lastR;
    run Refresher(lastR);
    run Timer(lastR)
}

/* needToken(after: stamp, reason:, now:) */
inline needToken(sg, se, me) {
    if
    :: curTok != 0 && curGen > sg -> issue(); act = SEND
    :: else ->
        if
        :: refreshing -> join(me)
        :: else ->
            if
            :: lfValid && lfGen == sg && lfEpoch > se -> act = FAIL; actErr = lfErr
            :: else ->
                assert(curTok == 0 || sg == curGen);  /* a stale 401 never starts a refresh */
                assert(!straggler[me]);               /* nor one sent before its refresh failed */
                startRefreshAndWait(me)
            fi
        fi
    fi
}

/* use(now:), without expiry dates */
inline use(me) {
    if
    :: refreshing && rGen == curGen -> join(me)
    :: else -> issue(); act = SEND
    fi
}

/* tokenRead(_:stamp:now:) */
inline tokenRead(tok, sg, se, me) {
    if
    :: tok == 0 -> needToken(sg, se, me)
    :: tok != 0 && curTok != 0 && tok == curTok -> use(me)
    :: tok != 0 && curTok != 0 && tok != curTok && (previous & (1 << tok)) != 0 -> use(me)
    :: else -> adopt(tok); issue(); act = SEND_READ
    fi
}

/* A refresh replacing generation `rGen` failed or timed out: the requests holding that token
   are stragglers, whose 401 must not start another refresh. */
inline markStragglers() {
    cr = 0;
    do
    :: cr < NC ->
        if
        :: holding[cr] && heldGen[cr] == rGen -> straggler[cr] = true
        :: else -> skip
        fi;
        cr++
    :: else -> break
    od
}

/* Answers every waiter of the refresh that just ended; they were all `waiting`. */
inline complete() {
    cw = 1;
    doneWaiters = 0;
    do
    :: cw <= lastW ->
        if
        :: waiting[cw] ->
            waiting[cw] = false;
            doneWaiters = doneWaiters | (1 << cw);
            answer[owner[cw]]!doneOutcome, actTok, actGen, actEpoch, actErr
        :: else -> skip
        fi;
        cw++
    :: else -> break
    od
}

proctype Refresher(byte id) {
    byte tok;
    if
    :: atomic { failuresLeft > 0 -> failuresLeft-- };
        atomic {
            /* refreshFailed(_:_:) */
            if
            :: refreshing && rId == id ->
                refreshing = false;
                epoch++;
                lfValid = true; lfGen = rGen; lfEpoch = epoch; lfErr = E_FAILED;
                badEnds++;
                markStragglers();
                doneOutcome = 2; actErr = E_FAILED;
                complete()
            :: else ->
                abandoned = abandoned & ~(1 << id);
                doneWaiters = 0; doneOutcome = 2; actErr = E_FAILED
            fi;
            printf("TRACE failed id=%d waiters=%d outcome=%d tok=0 gen=0 epoch=0 err=%d\n", id, doneWaiters, doneOutcome, actErr)
        }
    :: atomic { tok = nextTok; nextTok++ };    /* the server issues a token */
        provider = tok;                          /* the provider persists it, then returns it */
        atomic {
            /* refreshSucceeded(_:token:expiresAt:now:) */
            if
            :: refreshing && rId == id ->
                refreshing = false;
                epoch++;
                lfValid = false;
                if
                :: curTok == tok && curGen > rGen -> skip   /* read and adopted meanwhile */
                :: else -> adopt(tok)
                fi;
                issue(); doneOutcome = 1; actErr = 0;
                complete()
            :: else ->
                /* lateRefreshSucceeded */
                doneWaiters = 0;
                if
                :: (abandoned & (1 << id)) != 0 ->
                    abandoned = abandoned & ~(1 << id);
                    if
                    :: curGen == abandonedGen[id] ->
                        lfValid = false;
                        adopt(tok);
                        issue(); doneOutcome = 1; actErr = 0
                    :: else -> doneOutcome = 2; actErr = E_TIMEOUT; actTok = 0; actGen = 0; actEpoch = 0
                    fi
                :: else -> doneOutcome = 2; actErr = E_TIMEOUT; actTok = 0; actGen = 0; actEpoch = 0
                fi
            fi;
            printf("TRACE succeeded id=%d result=%d waiters=%d outcome=%d tok=%d gen=%d epoch=%d err=%d\n", id, tok, doneWaiters, doneOutcome, actTok, actGen, actEpoch, actErr)
        }
    fi
}

proctype Timer(byte id) {
    if
    :: atomic {
        timeoutsLeft > 0 -> timeoutsLeft--;
        /* refreshTimedOut(_:) */
        if
        :: refreshing && rId == id ->
            refreshing = false;
            epoch++;
            lfValid = true; lfGen = rGen; lfEpoch = epoch; lfErr = E_TIMEOUT;
            abandoned = abandoned | (1 << id);
            abandonedGen[id] = rGen;
            badEnds++;
            markStragglers();
            doneOutcome = 2; actErr = E_TIMEOUT;
            complete()
        :: else -> doneWaiters = 0; doneOutcome = 2; actErr = E_TIMEOUT
        fi;
        printf("TRACE timedout id=%d waiters=%d outcome=%d tok=0 gen=0 epoch=0 err=%d\n", id, doneWaiters, doneOutcome, actErr)
    }
    :: true -> skip    /* the refresh ends first, or this timeout never fires */
    fi
}

proctype Expiry() {
    atomic { minValid = nextTok; expiries++; printf("TRACE expired\n") }
}

/* The waiter `w` of request `me` waits for its answer, or is cancelled. On success the request
   gets the token in `tTok`, `tGen`, `tEpoch`; `ok` says whether it did. */
inline await(me, w, ok) {
    if
    :: answer[me]?outcome, tTok, tGen, tEpoch, err -> ok = (outcome == 1)
    :: atomic {
        cancelsLeft > 0 && waiting[w] -> cancelsLeft--;
        /* waiterLeft(_:) */
        waiting[w] = false;
        printf("TRACE left w=%d\n", w)
       };
       ok = false
    fi
}

/* Copies a decision out of the shared result variables, inside the transition's atomic step. */
inline take() {
    myAct = act; myW = actW; tTok = actTok; tGen = actGen; tEpoch = actEpoch
}

inline decided(me, ok) {
    if
    :: myAct == SEND || myAct == SEND_READ -> ok = true
    :: myAct == WAIT || myAct == START -> await(me, myW, ok)
    :: myAct == FAIL -> ok = false
    fi;
    if
    :: ok -> atomic { holding[me] = true; heldGen[me] = tGen; straggler[me] = false }
    :: else -> skip
    fi
}

inline unauthorizedDecision(g, e, me) {
    needToken(g, e, me);
    printf("TRACE unauthorized sg=%d se=%d act=%d w=%d r=%d tok=%d gen=%d epoch=%d err=%d\n", g, e, act, actW, actR, actTok, actGen, actEpoch, actErr)
}

proctype Request(byte me) {
    byte sg, se, tok, tTok, tGen, tEpoch, outcome, err, myAct, myW;
    bool ok, accepted;
    atomic { sg = curGen; se = epoch };          /* the stamp */
    tok = provider;                              /* provider.currentToken() */
    atomic {
        tokenRead(tok, sg, se, me);
        printf("TRACE read provider=%d sg=%d se=%d act=%d w=%d r=%d tok=%d gen=%d epoch=%d err=%d\n", tok, sg, se, act, actW, actR, actTok, actGen, actEpoch, actErr);
        take()
    };
    decided(me, ok);
    if
    :: ok ->
        accepted = (tTok >= minValid);           /* the first send */
        if
        :: !accepted ->
            atomic {
                unauthorizedDecision(tGen, tEpoch, me);
                take()
            };
            decided(me, ok)                      /* the retry, if any, is final */
        :: else -> skip
        fi
    :: else -> skip
    fi;
    atomic { finished++ }
}

init {
    atomic {
        byte i = 0;
        run Expiry();
        do
        :: i < NC -> run Request(i); i++
        :: else -> break
        od
    }
}

ltl served { <> (finished == NC) }
