-- Reserved: number 35 belongs to a branch built in parallel (events and deadlines on waits,
-- issue 32 items 2 and 3). Empty here so that the versions stay consecutive; the merge takes
-- that branch's migration in its place.
SELECT 1;
